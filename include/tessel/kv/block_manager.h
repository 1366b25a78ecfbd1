// KV block manager: fixed-size token blocks of the host KV cache, one block table per sequence.
//
// A sequence's KV lives in host blocks once it is offloaded ("committed"); the tokens of the chunk
// being prefilled sit in the engine's prefill buffer and the tokens decoded since the last full
// block sit in its decode buffer. The manager only does the bookkeeping (which host block holds
// which tokens); the OffloadEngine moves the bytes.
//
// Rules: prefill chunks are appended while every committed block is full, so only the last
// prefill block may be partial; decode tokens fill the decode buffer and are committed one full
// block at a time.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace tessel::kv {

using SequenceId = int64_t;

class KvBlockManager {
 public:
  KvBlockManager(int64_t num_host_blocks, int64_t block_size);

  int64_t block_size() const { return block_size_; }
  int64_t num_host_blocks() const { return num_host_blocks_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }

  SequenceId create_sequence();
  // Returns every block of the sequence (committed and pending) to the free list.
  void release_sequence(SequenceId seq);

  // Reserves ceil(num_tokens / block_size) blocks for a prefill chunk and returns them (pending
  // until commit_prefill_chunk). Throws Error when blocks run out, a chunk is already pending, or
  // the last committed block is partial.
  std::vector<int32_t> allocate_prefill_chunk(SequenceId seq, int64_t num_tokens);
  // Marks the pending chunk's blocks as committed (their KV is on its way to the host cache).
  void commit_prefill_chunk(SequenceId seq);

  // Host blocks whose KV has been offloaded (get_prefilled_cpu_blocks in the SparsePolicy guide), in order.
  const std::vector<int32_t>& get_prefilled_blocks(SequenceId seq) const;
  // Valid tokens of each of those blocks (block_size except possibly the last prefill block).
  const std::vector<int32_t>& prefilled_block_tokens(SequenceId seq) const;
  // Tokens held in committed host blocks (get_prefill_len in the SparsePolicy guide).
  int64_t get_prefill_len(SequenceId seq) const;

  // Decode bookkeeping: tokens currently in the decode buffer, [0, block_size).
  int64_t decode_buffer_len(SequenceId seq) const;
  // Counts one more decoded token; returns true when the decode buffer is now full and must be
  // offloaded into a block from allocate_decode_block().
  bool append_decode_token(SequenceId seq);
  int32_t allocate_decode_block(SequenceId seq);
  // Commits the full decode buffer as the given block (from allocate_decode_block) and empties it.
  void commit_decode_block(SequenceId seq, int32_t block);

  // Total tokens of the sequence: committed + pending chunk + decode buffer.
  int64_t total_len(SequenceId seq) const;

 private:
  struct SequenceState {
    std::vector<int32_t> blocks;        // committed, in order
    std::vector<int32_t> block_tokens;  // valid tokens per committed block
    std::vector<int32_t> pending;       // blocks of the chunk being prefilled
    int64_t pending_tokens = 0;
    int64_t committed_tokens = 0;
    int64_t decode_tokens = 0;
    int32_t decode_block = -1;          // reserved for the decode buffer, -1 when none
  };
  SequenceState& state(SequenceId seq);
  const SequenceState& state(SequenceId seq) const;
  int32_t take_block(SequenceId seq);

  int64_t num_host_blocks_;
  int64_t block_size_;
  std::vector<int32_t> free_blocks_;  // a stack; lowest ids are handed out first
  std::map<SequenceId, SequenceState> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace tessel::kv
