// A step as rank 0 sends it to the other ranks (declared in executor.h).
#include <cstring>

#include "duet/core/error.h"
#include "duet/model/executor.h"

namespace duet {
namespace {

constexpr uint32_t kMagic = 0x50545344;  // "DSTP"

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) { out_.clear(); }
  template <typename T>
  void put(T v) {
    append(&v, sizeof(v));
  }
  template <typename T>
  void put_array(const T* data, size_t count) {
    put<uint64_t>(count);
    append(data, count * sizeof(T));
  }

 private:
  void append(const void* p, size_t bytes) {
    const size_t at = out_.size();
    out_.resize(at + bytes);
    if (bytes > 0) std::memcpy(out_.data() + at, p, bytes);
  }
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  template <typename T>
  T get() {
    T v;
    take(&v, sizeof(v));
    return v;
  }
  template <typename T>
  void get_array(std::vector<T>& out) {
    const auto count = get<uint64_t>();
    if (count > (in_.size() - at_) / sizeof(T)) bad("an array longer than the message");
    out.resize(static_cast<size_t>(count));
    take(out.data(), static_cast<size_t>(count) * sizeof(T));
  }
  bool done() const { return at_ == in_.size(); }
  [[noreturn]] void bad(const char* what) const {
    fail(ErrorCode::kDataLoss, "step message of {} bytes: {} at byte {}", in_.size(), what, at_);
  }

 private:
  void take(void* p, size_t bytes) {
    if (bytes > in_.size() - at_) bad("it ends early");
    if (bytes > 0) std::memcpy(p, in_.data() + at_, bytes);
    at_ += bytes;
  }
  const std::vector<uint8_t>& in_;
  size_t at_ = 0;
};

}  // namespace

void encode_step(const BatchInput& batch, std::span<const std::pair<int32_t, int32_t>> block_copies,
                 std::vector<uint8_t>& out) {
  Writer w(out);
  w.put(kMagic);
  w.put_array(batch.token_ids.data(), batch.token_ids.size());
  w.put_array(batch.positions.data(), batch.positions.size());
  w.put_array(batch.slot_mapping.data(), batch.slot_mapping.size());
  w.put_array(batch.logits_rows.data(), batch.logits_rows.size());
  w.put_array(batch.hidden_rows.data(), batch.hidden_rows.size());
  w.put<int32_t>(batch.attention.block_size);
  w.put<int32_t>(batch.attention.num_tokens);
  w.put<uint64_t>(batch.attention.seqs.size());
  for (const PagedSequence& s : batch.attention.seqs) {
    w.put(s.token_start);
    w.put(s.num_tokens);
    w.put(s.context_len);
    w.put_array(s.block_table, static_cast<size_t>(s.num_blocks));
  }
  w.put_array(block_copies.data(), block_copies.size());
  w.put_array(batch.lora_runs.data(), batch.lora_runs.size());
}

void decode_step(const std::vector<uint8_t>& message, BatchInput& batch, std::vector<std::vector<int32_t>>& tables,
                 std::vector<std::pair<int32_t, int32_t>>& block_copies) {
  Reader r(message);
  if (r.get<uint32_t>() != kMagic) r.bad("not a step");
  batch.clear();
  r.get_array(batch.token_ids);
  r.get_array(batch.positions);
  r.get_array(batch.slot_mapping);
  r.get_array(batch.logits_rows);
  r.get_array(batch.hidden_rows);
  batch.attention.block_size = r.get<int32_t>();
  batch.attention.num_tokens = r.get<int32_t>();
  const auto num_seqs = r.get<uint64_t>();
  if (num_seqs > message.size()) r.bad("more sequences than bytes");
  tables.resize(static_cast<size_t>(num_seqs));
  for (size_t i = 0; i < num_seqs; ++i) {
    PagedSequence s;
    s.token_start = r.get<int32_t>();
    s.num_tokens = r.get<int32_t>();
    s.context_len = r.get<int32_t>();
    r.get_array(tables[i]);
    s.block_table = tables[i].data();
    s.num_blocks = static_cast<int32_t>(tables[i].size());
    batch.attention.seqs.push_back(s);
  }
  r.get_array(block_copies);
  r.get_array(batch.lora_runs);
  if (!r.done()) r.bad("bytes left over");
  const size_t n = batch.token_ids.size();
  if (batch.positions.size() != n || batch.slot_mapping.size() != n ||
      static_cast<size_t>(batch.attention.num_tokens) != n) {
    r.bad("token arrays of different lengths");
  }
}

void encode_lora_message(const LoraMessage& m, std::vector<uint8_t>& out) {
  Writer w(out);
  w.put(kLoraMessage);
  w.put<int32_t>(m.load ? 1 : 0);
  w.put<int32_t>(m.slot);
  w.put_array(m.source.name.data(), m.source.name.size());
  w.put_array(m.source.path.data(), m.source.path.size());
}

bool decode_lora_message(const std::vector<uint8_t>& message, LoraMessage& m) {
  uint32_t kind = 0;
  if (message.size() < 12) return false;
  std::memcpy(&kind, message.data(), 4);
  if (kind != kLoraMessage) return false;
  Reader r(message);
  r.get<uint32_t>();
  m.load = r.get<int32_t>() != 0;
  m.slot = r.get<int32_t>();
  std::vector<char> text;
  r.get_array(text);
  m.source.name.assign(text.begin(), text.end());
  r.get_array(text);
  m.source.path.assign(text.begin(), text.end());
  if (!r.done()) r.bad("bytes left over");
  return true;
}

}  // namespace duet
