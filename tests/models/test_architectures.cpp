// Every architecture (models/arch.h) on its tiny synth shape: the ragged forward over a slot
// mapping gives the same logits whether a sequence comes as one prefill, in chunks, or a token
// at a time next to another sequence (sliding windows crossed, experts routed per token); and
// files whose hyper-parameters and tensors disagree are refused naming the key or tensor.
// (Logits against llama.cpp and a float64 numpy implementation: tests/py/test_arch_*.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "models/arch.h"
#include "models/model.h"
#include "model_test_util.h"
#include "models/synth.h"
#include "models/weight_check.h"
#include "quant/quant_codecs.h"
#include "runtime/evicting_seq.h"
#include "runtime/session.h"

namespace tern {
namespace {

using tern::testing::logits_in_steps;
using tern::testing::open_file;

const char* const kTinyShapes[] = {"llama3-tiny", "mixtral-tiny", "qwen2-tiny", "qwen2moe-tiny", "qwen3-tiny",
                                   "qwen3moe-tiny", "phi3-tiny", "gemma2-tiny", "gemma3-tiny", "gpt-oss-tiny",
                                   "mamba-tiny", "mamba2-tiny", "deepseek2-tiny", "deepseek3-tiny", "deepseek2-lite-tiny",
                                   "granitehybrid-tiny", "granitehybrid-dense-tiny", "rwkv7-tiny", "rwkv6-tiny"};

std::string synth_file(const std::string& shape) {
  const std::string path = ::testing::TempDir() + "tern_arch_" + shape + "_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = shape;
  synth_model(o, path);
  return path;
}

TEST(Architectures, EveryShapeLoadsAndNamesItsArchitecture) {
  for (const char* shape : kTinyShapes) {
    SCOPED_TRACE(shape);
    const std::string path = synth_file(shape);
    LoadedModel m{open_file(path), nullptr};
    m.model = load_model(m.file);
    const SynthShape& sh = find_synth_shape(shape);
    EXPECT_EQ(m.model->hparams().arch, sh.arch);
    if (sh.mla_kv_lora > 0) {  // latent attention: the cached row (latent + roped key) is the head
      EXPECT_EQ(m.model->hparams().head_dim, sh.mla_kv_lora + sh.mla_rope);
    } else if (sh.n_head > 0) {
      EXPECT_EQ(m.model->hparams().head_dim, sh.head_dim > 0 ? sh.head_dim : sh.n_embd / sh.n_head);
    }
    EXPECT_EQ(m.model->hparams().ssm.d_inner, sh.ssm_d_inner);
    EXPECT_EQ(m.model->hparams().n_expert, sh.n_expert);
    std::remove(path.c_str());
  }
}

TEST(Architectures, PrefillChunksAndDecodeGiveTheSameLogits) {
  std::vector<int32_t> ids = {1};
  for (int i = 0; i < 39; ++i) ids.push_back(int32_t(3 + (i * 37) % 500));  // 40 positions: past the 16-token windows
  for (const char* shape : kTinyShapes) {
    SCOPED_TRACE(shape);
    const std::string path = synth_file(shape);
    auto file = open_file(path);
    auto model = load_model(file);
    const std::vector<float> whole = logits_in_steps(*model, ids, 40, 1);
    float scale = 0.0f;
    for (float x : whole) {
      ASSERT_TRUE(std::isfinite(x));
      scale = std::max(scale, std::fabs(x));
    }
    ASSERT_GT(scale, 1.0f);  // decisive logits, not a model whose output is ~0
    // (chunk 1 alone: one-token decode steps, the experts' decode path)
    for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(16), int64_t(-1)})
      for (int n_threads : {1, 2}) {
        auto m2 = load_model(file);
        const std::vector<float> got = logits_in_steps(*m2, ids, std::max<int64_t>(1, chunk), n_threads, chunk < 0);
        ASSERT_EQ(got.size(), whole.size());
        float err = 0.0f;
        for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - whole[i]));
        EXPECT_LE(err, 1e-4f * scale) << "chunk " << chunk << ", " << n_threads << " threads";
      }
    std::remove(path.c_str());
  }
}

// One-token decode steps of a mixture of experts (the chosen experts' downs in row blocks whose
// size follows the thread count) give the same bits on 1, 2 and 3 threads. The tiny shapes'
// 64-wide experts take one block each, so this is mixtral-mini's first layer (1024-wide downs in
// 128-, 64- and 48-row blocks), Q4_0 as interleaved by the x86 kernels.
TEST(Architectures, MoeDecodeBlocksGiveTheSameBitsOnAnyThreadCount) {
  const std::string path = ::testing::TempDir() + "tern_arch_moe_blocks_" + std::to_string(::getpid()) + ".gguf";
  SynthOptions o;
  o.shape = "mixtral-mini";
  o.type = DType::Q4_0;
  o.n_layer = 1;
  synth_model(o, path);
  auto file = open_file(path);
  std::vector<int32_t> ids = {1};
  for (int i = 0; i < 11; ++i) ids.push_back(int32_t(5 + (i * 977) % 31000));
  // The pooled path on every step (not the small-model chooser's trials of this thread alone).
  ::setenv("TERN_SMALL_MODEL_PATH", "phased", 1);
  std::vector<std::vector<float>> got;
  for (int n_threads : {1, 2, 3}) {
    auto model = load_model(file);
    got.push_back(logits_in_steps(*model, ids, 1, n_threads, /*alone=*/true));
  }
  ::unsetenv("TERN_SMALL_MODEL_PATH");
  std::remove(path.c_str());
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), got[0].size());
    EXPECT_EQ(std::memcmp(got[i].data(), got[0].data(), got[0].size() * sizeof(float)), 0) << i + 1 << " threads";
  }
}

// Rewrites a tiny synth file through `edit` and returns the error of loading it.
std::string load_error(const std::string& shape, const std::function<void(const GgufFile&, GgufWriter&)>& edit) {
  const std::string path = synth_file(shape);
  auto src = open_file(path);
  GgufWriter w(3);
  edit(*src, w);
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  std::remove(path.c_str());
  try {
    auto file = std::make_shared<const GgufFile>(GgufFile::parse(bytes, bytes->data(), bytes->size(), "edited.gguf"));
    load_model(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void copy_all(const GgufFile& s, GgufWriter& w) {
  for (const auto& [k, v] : s.metadata()) w.set(k, v);
  for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
}

GgufValue u32_array(std::vector<uint32_t> xs) {
  std::vector<GgufValue> items;
  for (uint32_t x : xs) items.push_back(GgufValue::u32(x));
  return GgufValue::array(GgufType::U32, std::move(items));
}

TEST(Architectures, PerLayerArraysAreReadAndChecked) {
  // One value per layer, equal to the scalar: loads.
  EXPECT_EQ(load_error("qwen2-tiny", [](const GgufFile& s, GgufWriter& w) {
              copy_all(s, w);
              w.set("qwen2.attention.head_count_kv", u32_array({2, 2}));
              w.set("qwen2.feed_forward_length", u32_array({128, 128}));
            }),
            "(no error)");
  // A layer whose head count the tensors do not have: the tensor is named.
  std::string e = load_error("qwen2-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen2.attention.head_count_kv", u32_array({2, 1}));
  });
  EXPECT_NE(e.find("blk.1.attn_k.weight: expected 64 x 16, file has 64 x 32"), std::string::npos) << e;
  e = load_error("qwen2-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen2.feed_forward_length", u32_array({128, 128, 128}));
  });
  EXPECT_NE(e.find("qwen2.feed_forward_length has 3 values for 2 layers"), std::string::npos) << e;
}

TEST(Architectures, ExpertCountsMustMatchTheTensors) {
  std::string e = load_error("qwen3moe-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3moe.expert_count", GgufValue::u32(4));
  });
  EXPECT_NE(e.find("blk.0.ffn_gate_inp.weight: expected 64 x 4, file has 64 x 8"), std::string::npos) << e;
  e = load_error("qwen3moe-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3moe.expert_used_count", GgufValue::u32(9));
  });
  EXPECT_NE(e.find("expert_used_count 9 must be in 1..expert_count 8"), std::string::npos) << e;
  e = load_error("mixtral-tiny", [](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata())
      if (k != "llama.expert_count") w.set(k, v);
    for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("blk.0.ffn_gate_inp.weight present but llama.expert_count is missing"), std::string::npos) << e;
  e = load_error("qwen2moe-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen2moe.expert_feed_forward_length", GgufValue::u32(32));
  });
  EXPECT_NE(e.find("blk.0.ffn_gate_exps.weight: expected 64 x 32 x 4, file has 64 x 64 x 4"), std::string::npos) << e;
}

TEST(Architectures, FusedAndHeadShapesAreChecked) {
  std::string e = load_error("phi3-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("phi3.attention.head_count_kv", GgufValue::u32(2));
  });
  EXPECT_NE(e.find("blk.0.attn_qkv.weight: expected 64 x 128, file has 64 x 192"), std::string::npos) << e;
  e = load_error("qwen3-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("qwen3.attention.key_length", GgufValue::u32(16));
    w.set("qwen3.attention.value_length", GgufValue::u32(16));
  });
  EXPECT_NE(e.find("blk.0.attn_q.weight: expected 64 x 64, file has 64 x 128"), std::string::npos) << e;
  e = load_error("gemma3-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("gemma3.attention.value_length", GgufValue::u32(16));
  });
  EXPECT_NE(e.find("attention.value_length 16 differs from key_length 32"), std::string::npos) << e;
}

// gpt-oss's own tensors: sinks, output and expert biases, MXFP4 experts.
TEST(Architectures, GptOssTensorsAreChecked) {
  auto without = [](const std::string& name) {
    return [name](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata()) w.set(k, v);
      for (const auto& t : s.tensors())
        if (t.name != name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    };
  };
  for (const char* name : {"blk.1.attn_sinks.weight", "blk.2.attn_output.bias", "blk.0.ffn_gate_inp.bias",
                           "blk.0.ffn_down_exps.bias", "blk.0.post_attention_norm.weight"}) {
    const std::string e = load_error("gpt-oss-tiny", without(name));
    EXPECT_NE(e.find(name), std::string::npos) << e;
  }
  // Expert biases are one row per expert: [n_ff_exp, n_expert].
  std::string e = load_error("gpt-oss-tiny", [](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      std::vector<int64_t> ne = t.ne;
      if (t.name == "blk.1.ffn_up_exps.bias") ne = {ne[0] * ne[1]};
      w.add_tensor(t.name, t.type, ne, t.data, t.n_bytes);
    }
  });
  EXPECT_NE(e.find("blk.1.ffn_up_exps.bias: expected 64 x 4, file has 256"), std::string::npos) << e;
  // An MXFP4 block whose exponent (255) times its largest code (12) overflows: a corrupt file.
  std::vector<uint8_t> corrupt;
  e = load_error("gpt-oss-tiny", [&corrupt](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      const uint8_t* data = t.data;
      if (t.name == "blk.1.ffn_up_exps.weight") {
        corrupt.assign(t.data, t.data + t.n_bytes);
        corrupt[17 * 5] = 255;      // block 5's exponent
        corrupt[17 * 5 + 1] = 0x07;  // its element 0: code 7 (6.0, doubled 12)
        data = corrupt.data();
      }
      w.add_tensor(t.name, t.type, t.ne, data, t.n_bytes);
    }
  });
  EXPECT_NE(e.find("blk.1.ffn_up_exps.weight (mxfp4, 64 x 64 x 4) holds a non-finite value (NaN or Inf) in the "
                   "scale of block 5"),
            std::string::npos)
      << e;
  // An MXFP4 tensor whose rows are not whole 32-element blocks is refused when the file is read
  // (the writer refuses to write one: the header's dimensions are patched to 16 x 256 x 4).
  const std::string path = synth_file("gpt-oss-tiny");
  GgufWriter w(3);
  auto src = open_file(path);  // (the writer points into its tensors until to_bytes)
  copy_all(*src, w);
  auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
  std::remove(path.c_str());
  const std::string name = "blk.0.ffn_down_exps.weight";
  auto at = std::search(bytes->begin(), bytes->end(), name.begin(), name.end());
  ASSERT_NE(at, bytes->end());
  uint8_t* dims = &*at + name.size() + 4;  // after the name: n_dims (u32), then ne[] (u64)
  const uint64_t patched[3] = {16, 256, 4};
  std::memcpy(dims, patched, sizeof patched);
  try {
    GgufFile::parse(bytes, bytes->data(), bytes->size(), "edited.gguf");
    e = "(no error)";
  } catch (const Error& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("blk.0.ffn_down_exps.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("32"), std::string::npos) << e;
}

// Mamba-2's hyper-parameters and tensors (mamba2-tiny: d_inner 128 in 8 heads, 2 groups of 16
// states, 4 taps): groups that do not divide d_inner or the heads, heads that do not divide
// d_inner, tensors of the wrong shape or missing, a growing state (A > 0): each refused naming
// the file, the key or tensor and the shapes.
TEST(Architectures, Mamba2HyperParametersAndTensorsAreChecked) {
  auto with_key = [](const std::string& key, uint32_t v) {
    return [key, v](const GgufFile& s, GgufWriter& w) {
      copy_all(s, w);
      w.set(key, GgufValue::u32(v));
    };
  };
  std::string e = load_error("mamba2-tiny", with_key("mamba2.ssm.group_count", 3));
  EXPECT_NE(e.find("edited.gguf: mamba2.ssm.group_count 3 does not divide ssm.inner_size 128"), std::string::npos) << e;
  e = load_error("mamba2-tiny", with_key("mamba2.ssm.time_step_rank", 6));
  EXPECT_NE(e.find("edited.gguf: mamba2.ssm.inner_size 128 is not a whole number of heads (ssm.time_step_rank 6)"),
            std::string::npos)
      << e;
  e = load_error("mamba2-tiny", with_key("mamba2.ssm.group_count", 16));  // divides 128, not the 8 heads
  EXPECT_NE(e.find("mamba2.ssm.group_count 16 does not divide the 8 heads"), std::string::npos) << e;
  // Valid sizes the tensors do not have: 4 groups make ssm_in 128 + 128 + 2 x 4 x 16 + 8 = 392 wide.
  e = load_error("mamba2-tiny", with_key("mamba2.ssm.group_count", 4));
  EXPECT_NE(e.find("blk.0.ssm_in.weight: expected 64 x 392, file has 64 x 328"), std::string::npos) << e;
  e = load_error("mamba2-tiny", [](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata())
      if (k != "mamba2.ssm.group_count") w.set(k, v);
    for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("mamba2.ssm.group_count"), std::string::npos) << e;
  // Tensors reshaped: ssm_a as [n_head] (Mamba-2's is [1, n_head]), ssm_norm as [d_inner], the
  // conv's weight as [d_conv, d_inner] (without B and C).
  const auto reshaped = [](const std::string& name, std::vector<int64_t> ne) {
    return [name, ne](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata()) w.set(k, v);
      for (const auto& t : s.tensors()) {
        if (t.name != name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
        else w.add_tensor(t.name, t.type, ne, t.data, size_t(ne[0] * (ne.size() > 1 ? ne[1] : 1)) * 4);
      }
    };
  };
  e = load_error("mamba2-tiny", reshaped("blk.1.ssm_a", {8}));
  EXPECT_NE(e.find("edited.gguf: loading blk.1.ssm_a: expected 1 x 8, file has 8"), std::string::npos) << e;
  e = load_error("mamba2-tiny", reshaped("blk.2.ssm_norm.weight", {128}));
  EXPECT_NE(e.find("loading blk.2.ssm_norm.weight: expected 64 x 2, file has 128"), std::string::npos) << e;
  e = load_error("mamba2-tiny", reshaped("blk.0.ssm_conv1d.weight", {4, 128}));
  EXPECT_NE(e.find("loading blk.0.ssm_conv1d.weight: expected 4 x 192, file has 4 x 128"), std::string::npos) << e;
  e = load_error("mamba2-tiny", reshaped("blk.0.ssm_dt.bias", {4}));
  EXPECT_NE(e.find("loading blk.0.ssm_dt.bias: expected 8, file has 4"), std::string::npos) << e;
  for (const char* name : {"blk.1.ssm_norm.weight", "blk.2.ssm_dt.bias", "blk.0.ssm_d", "blk.1.ssm_conv1d.bias"}) {
    e = load_error("mamba2-tiny", [name](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata()) w.set(k, v);
      for (const auto& t : s.tensors())
        if (t.name != name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    });
    EXPECT_NE(e.find(name), std::string::npos) << e;
  }
  // A growing state: A > 0 at head 3 of layer 2.
  std::vector<float> a;
  e = load_error("mamba2-tiny", [&a](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors()) {
      const uint8_t* data = t.data;
      if (t.name == "blk.2.ssm_a") {
        a.assign(reinterpret_cast<const float*>(t.data), reinterpret_cast<const float*>(t.data) + 8);
        a[3] = 0.5f;
        data = reinterpret_cast<const uint8_t*>(a.data());
      }
      w.add_tensor(t.name, t.type, t.ne, data, t.n_bytes);
    }
  });
  EXPECT_NE(e.find("edited.gguf: blk.2.ssm_a holds 0.5 at head 3: Mamba-2's A must be <= 0"), std::string::npos) << e;
}

// RWKV-7's hyper-parameters and tensors (rwkv7-tiny: n_embd 128 in heads of 64, LoRA ranks 32 /
// 24 / 16 / 40): a head size that does not divide n_embd, a missing LoRA rank key, tensors of the
// wrong shape (a LoRA of another rank, token-shift mixes without the gate's) or missing: each
// refused naming the file, the key or tensor and the shapes.
TEST(Architectures, Rwkv7HyperParametersAndTensorsAreChecked) {
  auto with_key = [](const std::string& key, uint32_t v) {
    return [key, v](const GgufFile& s, GgufWriter& w) {
      copy_all(s, w);
      w.set(key, GgufValue::u32(v));
    };
  };
  std::string e = load_error("rwkv7-tiny", with_key("rwkv7.wkv.head_size", 48));
  EXPECT_NE(e.find("edited.gguf: rwkv7.wkv.head_size 48 does not divide embedding_length 128"), std::string::npos) << e;
  e = load_error("rwkv7-tiny", with_key("rwkv7.token_shift_count", 1));
  EXPECT_NE(e.find("edited.gguf: rwkv7.token_shift_count 1 is not 2"), std::string::npos) << e;
  // A valid rank the tensors do not have: the decay LoRA read as rank 16.
  e = load_error("rwkv7-tiny", with_key("rwkv7.attention.decay_lora_rank", 16));
  EXPECT_NE(e.find("blk.0.time_mix_w1.weight: expected 128 x 16, file has 128 x 32"), std::string::npos) << e;
  e = load_error("rwkv7-tiny", [](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata())
      if (k != "rwkv7.attention.gate_lora_rank") w.set(k, v);
    for (const auto& t : s.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("rwkv7.attention.gate_lora_rank"), std::string::npos) << e;
  const auto reshaped = [](const std::string& name, std::vector<int64_t> ne) {
    return [name, ne](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata()) w.set(k, v);
      for (const auto& t : s.tensors()) {
        if (t.name != name) {
          w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
        } else {
          int64_t n = 1;
          for (int64_t d : ne) n *= d;
          w.add_tensor(t.name, t.type, ne, t.data, size_t(n) * 4);
        }
      }
    };
  };
  // Five token-shift mixes (a file without the gate's): refused, not read past the tensor.
  e = load_error("rwkv7-tiny", reshaped("blk.1.time_mix_lerp_fused.weight", {128, 1, 1, 5}));
  EXPECT_NE(e.find("edited.gguf: loading blk.1.time_mix_lerp_fused.weight: expected 128 x 1 x 1 x 6"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("file has 128 x 1 x 1 x 5"), std::string::npos) << e;
  e = load_error("rwkv7-tiny", reshaped("blk.2.time_mix_r_k.weight", {64}));
  EXPECT_NE(e.find("loading blk.2.time_mix_r_k.weight: expected 128, file has 64"), std::string::npos) << e;
  e = load_error("rwkv7-tiny", reshaped("blk.1.time_mix_v2.weight", {24, 64}));
  EXPECT_NE(e.find("blk.1.time_mix_v2.weight: expected 16 x 128, file has 24 x 64"), std::string::npos) << e;
  for (const char* name : {"token_embd_norm.bias", "blk.1.time_mix_g2.weight", "blk.2.attn_norm_2.bias",
                           "blk.0.time_mix_lerp_fused.weight", "output_norm.bias"}) {
    e = load_error("rwkv7-tiny", [name](const GgufFile& s, GgufWriter& w) {
      for (const auto& [k, v] : s.metadata()) w.set(k, v);
      for (const auto& t : s.tensors())
        if (t.name != name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    });
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_NE(e.find("edited.gguf"), std::string::npos) << e;
  }
}

// llama.cpp's ternary types (models/weight_check.cpp): a TQ2_0 tensor whose 2-bit codes include
// 3 (no trit) and a TQ1_0 one holding a byte that no packing of trits gives (1, the alias of 0;
// in qh, 2: a fifth base-3 digit where the packing writes 0) are refused, naming the file, the
// tensor and the block; a non-finite f16 scale (the block's last field) as for the other types.
TEST(Architectures, TernaryWeightCodesAreChecked) {
  std::mt19937 rng(3);
  const auto check = [](DType type, const std::vector<uint8_t>& data) {
    GgufTensorInfo t;
    t.name = "blk.2.ffn_up.weight";
    t.type = type;
    t.ne = {512, 3};
    t.n_bytes = data.size();
    t.data = data.data();
    try {
      check_weights_finite("model-tq.gguf", t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (DType type : {DType::TQ1_0, DType::TQ2_0}) {
    const bool tq1 = type == DType::TQ1_0;
    const size_t bb = tq1 ? 54 : 66;
    std::vector<uint8_t> data(6 * bb);
    for (size_t b = 0; b < 6; ++b) {  // valid blocks of random trits, d = 0.5
      int8_t trits[256];
      for (auto& v : trits) v = int8_t(int(rng() % 3) - 1);
      if (tq1) codec::tq1_0_pack_block(trits, 0.5f, data.data() + b * bb);
      else codec::tq2_0_pack_block(trits, 0.5f, data.data() + b * bb);
    }
    EXPECT_EQ(check(type, data), "(no error)") << dtype_name(type);
    const std::string name = std::string("model-tq.gguf: tensor blk.2.ffn_up.weight (") + dtype_name(type) + ", 512 x 3) holds ";
    auto bad = data;
    if (tq1) {
      bad[4 * bb + 7] = 1;
    } else {
      bad[4 * bb + 7] = uint8_t((bad[4 * bb + 7] & ~0x30) | 0x30);  // element 128 + 64 + 7's code: 3
    }
    std::string e = check(type, bad);
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_NE(e.find(tq1 ? "no base-3 packing of trits" : "the 2-bit code 3, which is no trit"), std::string::npos) << e;
    EXPECT_NE(e.find("in block 4 (row 2)"), std::string::npos) << e;
    if (tq1) {  // qh: byte 2 packs the trits of byte 0 with a fifth digit 1
      bad = data;
      bad[1 * bb + 49] = 2;
      e = check(type, bad);
      EXPECT_NE(e.find("in block 1 (row 0)"), std::string::npos) << e;
      // and every canonical byte passes, in qs and qh
      for (int v = 0; v < 243; ++v) {
        bad = data;
        bad[3 * bb + 5] = uint8_t((v * 256 + 242) / 243);
        bad[3 * bb + 50] = uint8_t((v / 3 * 3 * 256 + 242) / 243);
        ASSERT_EQ(check(type, bad), "(no error)") << v;
      }
    }
    bad = data;
    bad[5 * bb + bb - 1] = 0x7C;  // d = inf
    bad[5 * bb + bb - 2] = 0x00;
    e = check(type, bad);
    EXPECT_NE(e.find("holds a non-finite value (NaN or Inf) in the scale of block 5 (row 2)"), std::string::npos) << e;
  }
}

// Mamba's state is a fixed size per sequence: the store's bytes do not grow with its slots (a
// context of 16 or 65536 tokens), only with the sequences it holds; and a session that rolls
// back (truncate: a chat's shared prefix, speculative decoding) recomputes the state and gives
// the logits of a session that never went past the kept prefix. Mamba-2's conv window also
// holds B and C of every group: (d_conv - 1) (d_inner + 2 n_group d_state) + d_inner d_state
// floats per layer (mamba2-tiny: 3 x 192 + 128 x 16), from the synth shape's own sizes.
TEST(Architectures, MambaStateIsFixedSizeAndRollsBackByRecompute) {
  for (const char* shape : {"mamba-tiny", "mamba2-tiny", "rwkv7-tiny", "rwkv6-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string path = synth_file(shape);
    auto file = open_file(path);
    auto model = load_model(file);
    const HParams& hp = model->hparams();
    ASSERT_TRUE(hp.recurrent());
    EXPECT_EQ(kv_bytes_per_token(hp, KvType::F16), 0);
    const SynthShape& sh = find_synth_shape(shape);
    const int64_t conv_channels = sh.ssm_d_inner + 2 * sh.ssm_n_group * sh.ssm_d_state;
    // RWKV-7: per layer the two shifted tokens (n_embd each), then the heads' [N][N] WKV states.
    const int64_t per_seq = (sh.rwkv_head_size > 0 ? 2 * sh.n_embd + sh.n_embd * sh.rwkv_head_size
                                                   : (sh.ssm_d_conv - 1) * conv_channels + sh.ssm_d_state * sh.ssm_d_inner) *
                            int64_t(sizeof(float)) * sh.n_layer;
    if (sh.rwkv_head_size > 0) {
      EXPECT_EQ(per_seq, (2 * 128 + 2 * 64 * 64) * 4 * 3);  // rwkv7-tiny, rwkv6-tiny: 2 heads of 64, 3 layers
    }
    if (sh.ssm_n_group > 0) {
      EXPECT_EQ(per_seq, (3 * 192 + 128 * 16) * 4 * 3);
    }
    EXPECT_EQ(make_kv_store(hp, 16, KvType::F16, 1).bytes(), per_seq);
    EXPECT_EQ(make_kv_store(hp, 65536, KvType::F16, 1).bytes(), per_seq);
    EXPECT_EQ(make_kv_store(hp, 16, KvType::F16, 4).bytes(), 4 * per_seq);
    EXPECT_EQ(make_kv_store(hp, 16, KvType::F16, 4).state_bytes_per_slot(), per_seq);

    std::vector<int32_t> ids = {1};
    for (int i = 0; i < 30; ++i) ids.push_back(int32_t(3 + (i * 53) % 500));
    SessionConfig cfg;
    cfg.n_ctx = 64;
    cfg.n_threads = 2;
    cfg.kv_type = KvType::F32;
    const int64_t V = hp.n_vocab;
    // a: the first 20 tokens, then the next 11; b: all 31 and 5 more, back to 20, then the 11.
    Session a(file, cfg), b(file, cfg);
    a.eval(std::span<const int32_t>(ids.data(), 20));
    const float* la = a.eval(std::span<const int32_t>(ids.data() + 20, 11));
    const std::vector<float> expect(la, la + V);
    b.eval(ids);
    b.eval(std::span<const int32_t>(ids.data(), 5));  // further still: 36 tokens of state
    b.truncate(20);
    ASSERT_EQ(b.n_past(), 20);
    const float* lb = b.eval(std::span<const int32_t>(ids.data() + 20, 11));
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(lb[v], expect[size_t(v)]) << v;
    std::remove(path.c_str());
  }
}

// A hybrid (granitehybrid-tiny: Mamba-2, attention, Mamba-2, attention): the K/V store holds
// rows of the two attention layers only (2 KV heads of 16, K and V: 2 x 2 x 32 f32 = 512 bytes a
// token), and each sequence's state slot the two Mamba-2 layers' states only ((4 - 1) x (128 + 2
// x 16) + 128 x 16 floats each), whatever the context; a session rolled back recomputes both and
// gives the logits of one that never went past the kept prefix.
TEST(Architectures, HybridStateHoldsOnlyTheMambaLayers) {
  const std::string path = synth_file("granitehybrid-tiny");
  auto file = open_file(path);
  auto model = load_model(file);
  const HParams& hp = model->hparams();
  ASSERT_TRUE(hp.recurrent() && hp.hybrid());
  EXPECT_FALSE(model->can_evict_kv());
  for (int64_t il = 0; il < 4; ++il) {
    EXPECT_EQ(hp.is_ssm_layer(il), il % 2 == 0) << il;
    EXPECT_EQ(hp.n_embd_kv(il), il % 2 == 0 ? 0 : 32) << il;
    EXPECT_EQ(hp.state_floats(il), il % 2 == 0 ? 3 * 160 + 128 * 16 : 0) << il;
  }
  const int64_t per_seq = 2 * (3 * 160 + 128 * 16) * 4;
  EXPECT_EQ(kv_bytes_per_token(hp, KvType::F32), 2 * 2 * 32 * 4);
  EXPECT_EQ(make_kv_store(hp, 16, KvType::F32, 1).state_bytes_per_slot(), per_seq);
  EXPECT_EQ(make_kv_store(hp, 16, KvType::F32, 3).bytes(), 16 * 512 + 3 * per_seq);
  EXPECT_EQ(make_kv_store(hp, 4096, KvType::F32, 3).bytes(), 4096 * 512 + 3 * per_seq);

  std::vector<int32_t> ids = {1};
  for (int i = 0; i < 30; ++i) ids.push_back(int32_t(3 + (i * 53) % 500));
  SessionConfig cfg;
  cfg.n_ctx = 64;
  cfg.n_threads = 2;
  cfg.kv_type = KvType::F32;
  Session a(file, cfg), b(file, cfg);
  a.eval(std::span<const int32_t>(ids.data(), 20));
  const float* la = a.eval(std::span<const int32_t>(ids.data() + 20, 11));
  const std::vector<float> expect(la, la + hp.n_vocab);
  b.eval(ids);
  b.truncate(20);
  const float* lb = b.eval(std::span<const int32_t>(ids.data() + 20, 11));
  for (int64_t v = 0; v < hp.n_vocab; ++v) ASSERT_EQ(lb[v], expect[size_t(v)]) << v;
  std::remove(path.c_str());
}

// A hybrid's layer pattern (attention.head_count_kv: 0 on the Mamba-2 layers) must agree with
// its tensors: a layer marked Mamba-2 that has attention tensors, or marked attention that has
// Mamba-2 ones, is refused naming the layer and the tensor; a pattern without Mamba-2 layers is
// refused; and a KV policy (eviction) is refused, naming the hybrid's state.
TEST(Architectures, HybridLayerPatternMustMatchTheTensors) {
  const auto with_kv_heads = [](std::vector<uint32_t> heads) {
    return [heads](const GgufFile& s, GgufWriter& w) {
      copy_all(s, w);
      w.set("granitehybrid.attention.head_count_kv", u32_array(heads));
    };
  };
  std::string e = load_error("granitehybrid-tiny", with_kv_heads({0, 2, 0, 0}));
  EXPECT_NE(e.find("edited.gguf: layer 3 is a Mamba-2 layer (granitehybrid.attention.head_count_kv[3] = 0) but the "
                   "file has blk.3.attn_q.weight"),
            std::string::npos)
      << e;
  e = load_error("granitehybrid-tiny", with_kv_heads({0, 2, 2, 2}));
  EXPECT_NE(e.find("edited.gguf: layer 2 is an attention layer (granitehybrid.attention.head_count_kv[2] = 2) but the "
                   "file has blk.2.ssm_in.weight, a Mamba-2 tensor"),
            std::string::npos)
      << e;
  e = load_error("granitehybrid-tiny", with_kv_heads({2, 2, 2, 2}));
  EXPECT_NE(e.find("granitehybrid.attention.head_count_kv is not 0 at any layer"), std::string::npos) << e;
  e = load_error("granitehybrid-tiny", with_kv_heads({0, 3, 0, 2}));  // 3 does not divide 4 query heads
  EXPECT_NE(e.find("attention.head_count_kv 3 does not divide head_count 4 (layer 1)"), std::string::npos) << e;
  // A layer whose Mamba-2 tensors are missing.
  e = load_error("granitehybrid-tiny", [](const GgufFile& s, GgufWriter& w) {
    for (const auto& [k, v] : s.metadata()) w.set(k, v);
    for (const auto& t : s.tensors())
      if (t.name != "blk.2.ssm_out.weight") w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  });
  EXPECT_NE(e.find("blk.2.ssm_out.weight"), std::string::npos) << e;

  const std::string path = synth_file("granitehybrid-tiny");
  auto file = open_file(path);
  auto model = load_model(file);
  try {
    check_policy_for_model(make_kv_policy("streaming", 4, 60, ""), *model, "m.gguf");
    ADD_FAILURE() << "a KV policy was accepted for a hybrid";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("m.gguf: --kv-policy streaming"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("granitehybrid is a hybrid whose Mamba-2 layers keep a fixed-size state"),
              std::string::npos)
        << err.what();
  }
  std::remove(path.c_str());
}

TEST(Architectures, UnsupportedArchitectureListsTheSupportedOnes) {
  const std::string e = load_error("qwen2-tiny", [](const GgufFile& s, GgufWriter& w) {
    copy_all(s, w);
    w.set("general.architecture", GgufValue::string("rwkv6qwen2"));
  });
  EXPECT_NE(e.find("unsupported architecture 'rwkv6qwen2' (tern runs: " + architecture_list() + ")"), std::string::npos) << e;
  for (const char* a : {"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "gpt-oss", "mamba", "mamba2", "rwkv7",
                        "rwkv6"})
    EXPECT_NE(architecture_list().find(a), std::string::npos) << a;
}

}  // namespace
}  // namespace tern
