#include "tessel/kv/block_manager.h"

#include <gtest/gtest.h>

#include "tessel/core/error.h"

namespace tessel::kv {
namespace {

TEST(KvBlockManager, PrefillChunksCommitInOrderWithPartialLastBlock) {
  KvBlockManager manager(10, 4);
  const SequenceId seq = manager.create_sequence();
  EXPECT_EQ(manager.allocate_prefill_chunk(seq, 8).size(), 2u);
  EXPECT_TRUE(manager.get_prefilled_blocks(seq).empty());  // pending until committed
  manager.commit_prefill_chunk(seq);
  EXPECT_EQ(manager.allocate_prefill_chunk(seq, 5).size(), 2u);
  manager.commit_prefill_chunk(seq);
  EXPECT_EQ(manager.get_prefilled_blocks(seq), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(manager.prefilled_block_tokens(seq), (std::vector<int32_t>{4, 4, 4, 1}));
  EXPECT_EQ(manager.get_prefill_len(seq), 13);
  EXPECT_EQ(manager.num_free_blocks(), 6);
  // The last block is partial: no further prefill chunk.
  EXPECT_THROW(manager.allocate_prefill_chunk(seq, 4), Error);
}

TEST(KvBlockManager, DecodeBufferCommitsFullBlocks) {
  KvBlockManager manager(4, 2);
  const SequenceId seq = manager.create_sequence();
  manager.allocate_prefill_chunk(seq, 3);
  manager.commit_prefill_chunk(seq);
  EXPECT_FALSE(manager.append_decode_token(seq));
  EXPECT_EQ(manager.total_len(seq), 4);
  EXPECT_TRUE(manager.append_decode_token(seq));
  EXPECT_THROW(manager.append_decode_token(seq), Error);  // full buffer must be committed first
  EXPECT_THROW(manager.commit_decode_block(seq, 3), Error);  // not the reserved block
  const int32_t block = manager.allocate_decode_block(seq);
  manager.commit_decode_block(seq, block);
  EXPECT_EQ(manager.decode_buffer_len(seq), 0);
  EXPECT_EQ(manager.get_prefill_len(seq), 5);
  EXPECT_EQ(manager.prefilled_block_tokens(seq).back(), 2);
  EXPECT_THROW(manager.allocate_prefill_chunk(seq, 2), Error);  // decoding already
}

TEST(KvBlockManager, ReleaseReturnsBlocksAndRejectsUnknownSequences) {
  KvBlockManager manager(3, 8);
  const SequenceId a = manager.create_sequence();
  manager.allocate_prefill_chunk(a, 24);
  EXPECT_EQ(manager.num_free_blocks(), 0);
  const SequenceId b = manager.create_sequence();
  EXPECT_THROW(manager.allocate_prefill_chunk(b, 1), Error);  // out of blocks
  manager.release_sequence(a);
  EXPECT_EQ(manager.num_free_blocks(), 3);
  EXPECT_THROW(manager.get_prefill_len(a), Error);
  EXPECT_THROW(KvBlockManager(0, 8), Error);
  EXPECT_THROW(KvBlockManager(4, 0), Error);
  EXPECT_THROW(manager.allocate_prefill_chunk(b, 0), Error);
  EXPECT_THROW(manager.commit_prefill_chunk(b), Error);  // nothing pending
}

}  // namespace
}  // namespace tessel::kv
