// The read-bandwidth probe behind tern bench's roofline: it reads exactly the memory it is given
// (whole aligned 8-byte words of each span, misaligned starts included), or a buffer of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "models/model.h"
#include "models/synth.h"
#include "tools/bandwidth_probe.h"

namespace tern {
namespace {

TEST(BandwidthProbe, ReadsTheGivenSpansWholeAlignedWordsOnly) {
  ThreadPool pool(2);
  std::vector<uint64_t> a(1000, 1), b(333, 2);
  const auto* pa = reinterpret_cast<const uint8_t*>(a.data());
  const auto* pb = reinterpret_cast<const uint8_t*>(b.data());
  // 3 bytes in: the first aligned word starts 5 bytes on; 8000 - 8 = 7992 bytes of whole words
  ReadBandwidthProbe probe(pool, {std::span(pa + 3, 7997), std::span(pb, size_t(333 * 8))});
  EXPECT_EQ(probe.bytes(), size_t(7992 + 333 * 8));
  const ReadRates r = probe.measure(2);
  EXPECT_GT(r.one_stream, 0.0);
  EXPECT_GT(r.streams, 0.0);
  // a's 999 words after its first (the span starts 3 bytes into it), each 1; b's 333 words of 2
  EXPECT_EQ(r.one_stream_sum, uint64_t(999 + 333 * 2));
  EXPECT_EQ(r.streams_sum, uint64_t(999 + 333 * 2));
  EXPECT_EQ(r.best(), std::max(r.one_stream, r.streams));
  ReadBandwidthProbe none(pool, std::vector<std::span<const uint8_t>>{});
  EXPECT_EQ(none.bytes(), 0u);
  EXPECT_EQ(none.measure(2).best(), 0.0);
  // 2.5 MiB: 10 pieces of 256 KiB, a group of 8 streams and one of 2; 2.5 MiB + 3 words: a
  // last piece of 3 words
  for (const size_t extra : {size_t(0), size_t(24)}) {
    ReadBandwidthProbe own(pool, (size_t(2560) << 10) + extra);
    EXPECT_EQ(own.bytes(), (size_t(2560) << 10) + extra);
    const ReadRates o = own.measure(1);
    EXPECT_GT(o.one_stream, 0.0);
    EXPECT_GT(o.streams, 0.0);
    const uint64_t n = own.bytes() / 8;  // the buffer holds 0, 1, ..., n - 1
    EXPECT_EQ(o.one_stream_sum, n * (n - 1) / 2);
    EXPECT_EQ(o.streams_sum, n * (n - 1) / 2);
  }
}

TEST(BandwidthProbe, ModelListsEveryMatrixADecodeStepReads) {
  const std::string path = ::testing::TempDir() + "probe_tiny.gguf";
  SynthOptions opt;
  opt.shape = "stories260k";
  opt.type = DType::F32;
  synth_model(opt, path);
  LoadedModel lm{open_model_file(path), nullptr};
  lm.model = load_model(lm.file);
  const auto& spans = lm.model->decode_weight_memory();
  const HParams& hp = lm.model->hparams();
  ASSERT_EQ(int64_t(spans.size()), 7 * hp.n_layer + 1);  // q k v o gate up down per layer, output
  size_t bytes = 0;
  for (const auto& s : spans) bytes += s.size();
  int64_t matrices = 0;  // the file's 2-D tensors but the token embeddings (tied: read as output)
  for (const auto& t : lm.file->tensors())
    if (t.ne.size() == 2 && t.name != "token_embd.weight") matrices += int64_t(t.n_bytes);
  const bool tied = lm.file->find_tensor("output.weight") == nullptr;
  if (tied) matrices += int64_t(lm.file->find_tensor("token_embd.weight")->n_bytes);
  EXPECT_EQ(int64_t(bytes), matrices);
}

}  // namespace
}  // namespace tern
