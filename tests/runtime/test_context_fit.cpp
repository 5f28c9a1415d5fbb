// plan_context: the default context sized to the memory, and the refusal of what cannot fit,
// as pure arithmetic on hyper-parameters, a K/V type and a memory figure (no model needed).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "runtime/context_fit.h"

namespace tern {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20, kGiB = int64_t(1) << 30;

// Llama-3.1-8B: 32 layers, 8 KV heads of 128: 128 KiB a token in f16; a 131072-token context.
HParams llama31_8b() {
  HParams hp;
  hp.n_ctx_train = 131072;
  hp.n_layer = 32;
  hp.n_embd = 4096;
  hp.n_head = 32;
  hp.n_head_kv = 8;
  hp.head_dim = 128;
  return hp;
}

ContextRequest request(int64_t available, KvType kv = KvType::F16) {
  ContextRequest r;
  r.hparams = llama31_8b();
  r.kv_type = kv;
  r.weight_bytes = int64_t(4.6 * double(kGiB));  // Q4_K_M
  r.memory = {available, available + 8 * kGiB};
  return r;
}

std::string refusal(const ContextRequest& r) {
  try {
    plan_context(r);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a refusal";
  return "";
}

TEST(ContextFit, DefaultIsCappedWellBelowALongTrainingContext) {
  const ContextPlan p = plan_context(request(32 * kGiB));
  EXPECT_EQ(p.n_ctx, kDefaultContextCap);
  EXPECT_EQ(p.kv_bytes, kDefaultContextCap * 128 * 1024);  // 512 MiB, not 16 GiB
  EXPECT_TRUE(p.note.empty());
  EXPECT_TRUE(p.warning.empty());
}

TEST(ContextFit, DefaultKeepsAShortTrainingContext) {
  ContextRequest r = request(32 * kGiB);
  r.hparams.n_ctx_train = 2048;
  EXPECT_EQ(plan_context(r).n_ctx, 2048);
}

TEST(ContextFit, DefaultShrinksToHalfTheMemoryLeftAfterTheWeights) {
  // 5 GiB available - 4.6 GiB of weights = 0.4 GiB; half of it is 1638 tokens of 128 KiB,
  // rounded down to 1536.
  const ContextPlan p = plan_context(request(5 * kGiB));
  EXPECT_EQ(p.n_ctx, 1536);
  EXPECT_EQ(p.kv_bytes, 1536 * 128 * 1024);
  EXPECT_NE(p.note.find("context 1536 tokens"), std::string::npos) << p.note;
  // f32 takes twice the bytes a token: half the tokens.
  EXPECT_EQ(plan_context(request(5 * kGiB, KvType::F32)).n_ctx, 768);
}

TEST(ContextFit, DefaultTimesParallelInServe) {
  ContextRequest r = request(32 * kGiB);
  r.serving = true;
  r.n_parallel = 4;
  ContextPlan p = plan_context(r);
  EXPECT_EQ(p.n_ctx, 4096);
  EXPECT_EQ(p.kv_bytes, 2 * kGiB);  // 4 x 4096 tokens x 128 KiB
  // 64 sequences: 27.4 GiB left, half of it is 13.7 GiB = 1753 tokens each, rounded to 1536.
  r.n_parallel = 64;
  p = plan_context(r);
  EXPECT_EQ(p.n_ctx, 1536);
  EXPECT_NE(p.note.find("x 64 sequences"), std::string::npos) << p.note;
}

TEST(ContextFit, DefaultRefusedWhenTheWeightsLeaveTooLittle) {
  // 40 MiB after the weights: half of it is 160 tokens, under the least default of 256; all
  // of it (--ctx, checked against the whole) holds 320.
  const std::string msg = refusal(request(request(0).weight_bytes + 40 * kMiB));
  EXPECT_NE(msg.find("the weights take 4.60 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--ctx 256 or less to use all of it"), std::string::npos) << msg;
  EXPECT_NE(refusal(request(4 * kGiB)).find("use a smaller or more quantized model"), std::string::npos);
}

TEST(ContextFit, ExplicitContextIsTakenWhenItFits) {
  ContextRequest r = request(32 * kGiB);
  r.n_ctx = 65536;  // 8 GiB of f16 K/V + 4.6 GiB: fits in 32
  const ContextPlan p = plan_context(r);
  EXPECT_EQ(p.n_ctx, 65536);
  EXPECT_EQ(p.kv_bytes, 8 * kGiB);
  EXPECT_TRUE(p.note.empty());
  EXPECT_TRUE(p.warning.empty());
  // Past the default's half share but within the memory: still taken.
  r.memory.available = 13 * kGiB;
  EXPECT_EQ(plan_context(r).n_ctx, 65536);
}

TEST(ContextFit, ExplicitContextBeyondTheMemoryIsRefusedWithWhatToPass) {
  ContextRequest r = request(16 * kGiB, KvType::F32);
  r.n_ctx = 131072;  // 32 GiB of f32 K/V
  const std::string msg = refusal(r);
  for (const char* want : {"a context of 131072 tokens needs 32.00 GiB of KV cache (f32, 256.00 KiB a token)",
                           "+ 4.60 GiB of weights = 36.60 GiB", "but 16.00 GiB of memory is available (of 24.00 GiB)",
                           "--ctx 46592 or less", "--kv-type f16"})
    EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
  EXPECT_EQ(msg.find("--parallel"), std::string::npos) << msg;  // run has no such flag
  r.kv_type = KvType::F16;
  EXPECT_EQ(refusal(r).find("--kv-type"), std::string::npos);  // already f16
}

TEST(ContextFit, ServeRefusalNamesParallelAndKvMemory) {
  ContextRequest r = request(16 * kGiB);
  r.serving = true;
  r.n_ctx = 32768;
  r.n_parallel = 8;  // 32 GiB
  const std::string msg = refusal(r);
  for (const char* want : {"32768 tokens x 8 sequences needs 32.00 GiB", "--ctx 11520 or less", "--parallel 2 or less",
                           "--kv-memory 11673M or less"})
    EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
}

TEST(ContextFit, KvMemoryGivesTheArenaAndATrainingContextClippedToIt) {
  ContextRequest r = request(32 * kGiB);
  r.serving = true;
  r.kv_memory_bytes = 2 * kGiB;  // 16384 tokens
  ContextPlan p = plan_context(r);
  EXPECT_EQ(p.kv_bytes, 2 * kGiB);
  EXPECT_EQ(p.n_ctx, 16384);
  r.kv_memory_bytes = 64 * kGiB;
  EXPECT_NE(refusal(r).find("--kv-memory 64.00 GiB needs"), std::string::npos);
}

TEST(ContextFit, WarnsAboveTheTrainingContext) {
  ContextRequest r = request(64 * kGiB);
  r.hparams.n_ctx_train = 4096;
  r.n_ctx = 8192;
  const ContextPlan p = plan_context(r);
  EXPECT_EQ(p.n_ctx, 8192);
  EXPECT_NE(p.warning.find("--ctx 8192 is longer than the 4096 tokens the model was trained on"), std::string::npos)
      << p.warning;
}

TEST(ContextFit, UnknownMemoryChecksNothing) {
  ContextRequest r = request(0);
  r.memory = {};
  EXPECT_EQ(plan_context(r).n_ctx, kDefaultContextCap);
  r.n_ctx = 1 << 24;
  r.n_parallel = 4096;
  r.serving = true;
  EXPECT_EQ(plan_context(r).n_ctx, 1 << 24);
}

TEST(ContextFit, HugeRequestsSaturateInsteadOfOverflowing) {
  ContextRequest r = request(16 * kGiB, KvType::F32);
  r.hparams.n_layer = 4096;
  r.hparams.n_head_kv = r.hparams.n_head = 1024;
  r.hparams.head_dim = 1024;
  r.n_ctx = 1 << 24;
  r.n_parallel = 4096;
  r.serving = true;
  EXPECT_NE(refusal(r).find("of memory is available"), std::string::npos);
}

TEST(MemoryInfo, ParsesMeminfo) {
  const MemoryInfo m = parse_meminfo(
      "MemTotal:       24683548 kB\nMemFree:        23549324 kB\nMemAvailable:   23818700 kB\nBuffers: 1 kB\n");
  EXPECT_EQ(m.total, int64_t(24683548) * 1024);
  EXPECT_EQ(m.available, int64_t(23818700) * 1024);
  EXPECT_EQ(parse_meminfo("").available, 0);
  EXPECT_EQ(parse_meminfo("MemAvailable: x kB\n").available, 0);
}

TEST(MemoryInfo, CgroupLimitCapsTheHostFigures) {
  const MemoryInfo host{20 * kGiB, 24 * kGiB};
  // 8 GiB limit, 5 GiB used of which 2 GiB page cache: 5 GiB headroom.
  MemoryInfo m = apply_cgroup_limit(host, 8 * kGiB, 5 * kGiB, 2 * kGiB);
  EXPECT_EQ(m.available, 5 * kGiB);
  EXPECT_EQ(m.total, 8 * kGiB);
  // No limit (v2 "max" reads as -1; v1 writes ~2^63): the host's.
  m = apply_cgroup_limit(host, -1, 5 * kGiB, 0);
  EXPECT_EQ(m.available, host.available);
  m = apply_cgroup_limit(host, int64_t(9223372036854771712), 5 * kGiB, 0);
  EXPECT_EQ(m.total, host.total);
  // A limit above what the host has leaves the host's MemAvailable.
  EXPECT_EQ(apply_cgroup_limit(host, 64 * kGiB, 0, 0).available, host.available);
}

}  // namespace
}  // namespace tern
