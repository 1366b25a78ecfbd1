#include "tessel/kv/block_manager.h"

#include <string>

#include "tessel/core/error.h"

namespace tessel::kv {

KvBlockManager::KvBlockManager(int64_t num_host_blocks, int64_t block_size)
    : num_host_blocks_(num_host_blocks), block_size_(block_size) {
  if (num_host_blocks <= 0 || num_host_blocks > INT32_MAX)
    fail_argument("num_host_blocks", "in [1, 2^31)", num_host_blocks);
  if (block_size <= 0) fail_argument("block_size", "> 0", block_size);
  free_blocks_.reserve(static_cast<size_t>(num_host_blocks));
  for (int64_t b = num_host_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
}

KvBlockManager::SequenceState& KvBlockManager::state(SequenceId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) fail_argument("seq", "a live sequence id", seq);
  return it->second;
}

const KvBlockManager::SequenceState& KvBlockManager::state(SequenceId seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) fail_argument("seq", "a live sequence id", seq);
  return it->second;
}

int32_t KvBlockManager::take_block(SequenceId seq) {
  if (free_blocks_.empty())
    throw Error(detail::concat("KvBlockManager: out of host blocks (", num_host_blocks_,
                               " in total) while growing sequence ", seq));
  const int32_t block = free_blocks_.back();
  free_blocks_.pop_back();
  return block;
}

SequenceId KvBlockManager::create_sequence() {
  const SequenceId id = next_id_++;
  sequences_[id] = SequenceState{};
  return id;
}

void KvBlockManager::release_sequence(SequenceId seq) {
  SequenceState& s = state(seq);
  for (int32_t b : s.blocks) free_blocks_.push_back(b);
  for (int32_t b : s.pending) free_blocks_.push_back(b);
  if (s.decode_block >= 0) free_blocks_.push_back(s.decode_block);
  sequences_.erase(seq);
}

std::vector<int32_t> KvBlockManager::allocate_prefill_chunk(SequenceId seq, int64_t num_tokens) {
  SequenceState& s = state(seq);
  if (num_tokens <= 0) fail_argument("num_tokens", "> 0", num_tokens);
  if (!s.pending.empty()) fail_argument("seq", "no pending prefill chunk", "a chunk not yet committed");
  if (s.decode_tokens > 0 || s.decode_block >= 0)
    fail_argument("seq", "prefill before any decode step", "a sequence already decoding");
  if (s.committed_tokens % block_size_ != 0)
    fail_argument("seq", "full committed blocks before another prefill chunk",
                  detail::concat(s.committed_tokens, " tokens (last block partial)"));
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  if (needed > num_free_blocks())
    throw Error(detail::concat("KvBlockManager: chunk of ", num_tokens, " tokens needs ", needed,
                               " blocks, only ", num_free_blocks(), " free"));
  for (int64_t i = 0; i < needed; ++i) s.pending.push_back(take_block(seq));
  s.pending_tokens = num_tokens;
  return s.pending;
}

void KvBlockManager::commit_prefill_chunk(SequenceId seq) {
  SequenceState& s = state(seq);
  if (s.pending.empty()) fail_argument("seq", "a pending prefill chunk", "none");
  int64_t left = s.pending_tokens;
  for (int32_t b : s.pending) {
    const int64_t tokens = left < block_size_ ? left : block_size_;
    s.blocks.push_back(b);
    s.block_tokens.push_back(static_cast<int32_t>(tokens));
    left -= tokens;
  }
  s.committed_tokens += s.pending_tokens;
  s.pending.clear();
  s.pending_tokens = 0;
}

const std::vector<int32_t>& KvBlockManager::get_prefilled_blocks(SequenceId seq) const { return state(seq).blocks; }

const std::vector<int32_t>& KvBlockManager::prefilled_block_tokens(SequenceId seq) const {
  return state(seq).block_tokens;
}

int64_t KvBlockManager::get_prefill_len(SequenceId seq) const { return state(seq).committed_tokens; }

int64_t KvBlockManager::decode_buffer_len(SequenceId seq) const { return state(seq).decode_tokens; }

bool KvBlockManager::append_decode_token(SequenceId seq) {
  SequenceState& s = state(seq);
  if (!s.pending.empty()) fail_argument("seq", "no pending prefill chunk when decoding", "a pending chunk");
  if (s.decode_tokens >= block_size_)
    fail_argument("seq", "a decode buffer with room", "a full buffer not yet committed");
  ++s.decode_tokens;
  return s.decode_tokens == block_size_;
}

int32_t KvBlockManager::allocate_decode_block(SequenceId seq) {
  SequenceState& s = state(seq);
  if (s.decode_block < 0) s.decode_block = take_block(seq);
  return s.decode_block;
}

void KvBlockManager::commit_decode_block(SequenceId seq, int32_t block) {
  SequenceState& s = state(seq);
  if (s.decode_block < 0 || block != s.decode_block)
    fail_argument("block", detail::concat("the block from allocate_decode_block (", s.decode_block, ")"), block);
  if (s.decode_tokens != block_size_)
    fail_argument("seq", detail::concat("a full decode buffer (", block_size_, " tokens)"), s.decode_tokens);
  s.blocks.push_back(block);
  s.block_tokens.push_back(static_cast<int32_t>(block_size_));
  s.committed_tokens += block_size_;
  s.decode_tokens = 0;
  s.decode_block = -1;
}

int64_t KvBlockManager::total_len(SequenceId seq) const {
  const SequenceState& s = state(seq);
  return s.committed_tokens + s.pending_tokens + s.decode_tokens;
}

}  // namespace tessel::kv
