// tern compare: the compression surveys' table for your own model. For every method: quantize
// (compress/methods.h), then measure weight memory, run memory (peak RSS of a fixed greedy
// generation), prompt and generation speed, TTFT, TBT and perplexity. Each measurement runs in a
// child `tern` process, so that every method's peak RSS is its own.
//
// With --kv LIST it compares K/V cache configurations of the model instead (kv_compare.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compress/calibrate.h"
#include "compress/methods.h"
#include "compress/report.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli_util.h"
#include "tools/kl_divergence.h"
#include "tools/commands.h"
#include "tools/kv_compare.h"
#include "tools/prompt_compare.h"
#include "tools/llm_pruner.h"
#include "tools/model_args.h"
#include "tools/progress.h"
#include "tools/prune_recover.h"
#include "tools/qat_export.h"

namespace tern {
namespace {

// The child-process helpers are kv_compare.h's (shared with --kv).
std::string shell_quote(const std::string& s) { return compare_shell_quote(s); }
nlohmann::json run_child(const std::string& self, const std::string& args) { return run_tern_child(self, args); }

std::vector<std::string> split_methods(const std::string& list) {
  std::vector<std::string> v;
  std::stringstream ss(list);
  for (std::string m; std::getline(ss, m, ',');) {
    m.erase(0, m.find_first_not_of(' '));
    m.erase(m.find_last_not_of(' ') + 1);
    if (!m.empty()) v.push_back(m);
  }
  return v;
}

std::string main_format(const MethodReport& rep) {
  // The type holding the most weights among the layers' linear weights ("blk.*") that the method
  // stored in its own choice of type (per-tensor fallbacks aside).
  std::map<std::string, int64_t> bytes;
  for (const auto& t : rep.quant.tensors)
    if (t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2 && t.type == t.requested)
      bytes[dtype_name(t.type)] += t.ne[0] * t.ne[1];
  if (bytes.empty()) {  // every layer fell back (e.g. q4_k of 64-wide rows)
    for (const auto& t : rep.quant.tensors)
      if (t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2) bytes[std::string(dtype_name(t.type)) + " (fallback)"] += t.ne[0] * t.ne[1];
  }
  std::string best;
  int64_t most = -1;
  for (const auto& [name, b] : bytes)
    if (b > most) most = b, best = name;
  return best;
}

// What a method wrote, read back from its file (a child process made it: tern distill --qat).
MethodReport report_of_file(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  MethodReport rep;
  for (const GgufTensorInfo& t : f.tensors()) {
    TensorReport r;
    r.name = t.name;
    r.ne = t.ne;
    r.src_type = r.requested = r.type = t.type;
    r.bytes = int64_t(t.n_bytes);
    r.reason = "written";
    rep.quant.bytes += r.bytes;
    rep.quant.tensors.push_back(std::move(r));
  }
  return rep;
}

}  // namespace

int cmd_compare(int argc, char** argv) {
  CLI::App app{"Quantize a model with each compression method and tabulate weight memory, run memory, speed\n"
               "and perplexity (docs/compression.md); or, with --kv, tabulate K/V cache configurations."};
  std::string model, methods_arg, ppl_file, calib_file, json_out, chart, out_dir;
  int64_t ctx = 512, ppl_chunks = -1, gen_tokens = 64, prompt_tokens = 128;
  int threads = 0, reps = 1;
  bool json = false, speed_only = false, keep_files = false;
  MethodOptions mopts;
  CalibOptions copts;
  copts.n_tokens = -1;
  std::string known;
  for (const auto& m : compression_methods()) known += std::string(known.empty() ? "" : ", ") + m.name;
  app.add_option("-m,--model", model, "source model (f32, f16 or bf16 GGUF)")->required();
  app.add_option("--methods", methods_arg,
                 "comma-separated methods (default: the source type, q8_0, q4_0, q4_k, gptq-int4, awq-int4, "
                 "llm.int8, smoothquant-w8a8); known: " + known +
                     ", pruning: magnitude|wanda|sparsegpt[-owl]-<sparsity> (wanda-50, sparsegpt-2:4), and "
                     "quantization-aware training: qat-<type> and, with learned scales, qat-lsq-<type> (qat-q4_0, "
                     "qat-q2_k, qat-ternary, qat-lsq-q4_0; on --recover-data), and distillation into a half-depth "
                     "student: kd-ce, kd-response, kd-feature, kd-relation (on --recover-data)");
  std::string kv_arg;
  int64_t kv_long = 0;
  app.add_option("--kv", kv_arg,
                 "compare K/V cache configurations instead of weight methods (not with --methods): comma-separated "
                 "entries, each " + kv_compare_forms());
  app.add_option("--kv-long", kv_long, "with --kv: tokens of --ppl-file scored as one sequence (default: --ctx)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  app.add_option("--ppl-file", ppl_file, "text for perplexity (and, by default, calibration and the prompt)");
  app.add_option("-c,--ctx", ctx, "perplexity context (tokens per chunk; with --kv: the context, of which a policy's budget is taken, "
                 "and the segment of the long sequence)")->capture_default_str()
      ->check(CLI::Range(int64_t(8), int64_t(1) << 20));
  app.add_option("--ppl-chunks", ppl_chunks, "score at most this many chunks (-1: the whole text)");
  app.add_option("--calib", calib_file, "calibration text (default: --ppl-file; its last tokens are used)");
  app.add_option("--calib-tokens", copts.n_tokens, "calibration tokens (default 4096; 256 with --speed-only)");
  app.add_option("--gen-tokens", gen_tokens, "tokens generated for speed and memory (with --kv: the decode test, default min(64, --ctx / 4))")->capture_default_str()
      ->check(CLI::Range(int64_t(2), int64_t(1) << 16));
  app.add_option("--prompt-tokens", prompt_tokens,
                 "prompt length for prompt processing and TTFT (with --kv: the prompt before the decode test, "
                 "default --ctx - --gen-tokens - 1)")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  app.add_option("--reps", reps, "speed runs per method or --kv entry (the median is reported)")->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--speed-only", speed_only,
               "no perplexity; GPTQ/AWQ/SmoothQuant store round-to-nearest values in their format (random-weight "
               "models: same size and speed)");
  app.add_option("--threshold", mopts.threshold, "LLM.int8() outlier threshold")->capture_default_str();
  app.add_option("--alpha", mopts.alpha, "SmoothQuant migration strength")->capture_default_str();
  app.add_option("--damp", mopts.damp, "GPTQ dampening")->capture_default_str();
  app.add_flag("--act-order", mopts.act_order, "GPTQ act-order");
  app.add_option("--group", mopts.group, "GPTQ/AWQ/RTN group size")->capture_default_str();
  app.add_option("--ratio-of", mopts.structured_ratio_of,
                 "structured pruning (flap-20, llm-pruner-20, structured-magnitude-20): the percentage is of the model's "
                 "parameters, as the papers count, or of the layers' weights alone")
      ->check(CLI::IsMember({"model", "layers"}))
      ->capture_default_str();
  RecoverOptions recover;
  app.add_option("--recover-data", recover.data,
                 "training text of the pruning methods' +recover variants and the qat- methods (not the perplexity text)");
  app.add_option("--recover-tokens", recover.tokens, "tokens of each +recover fine-tune and qat- run")->capture_default_str();
  app.add_option("--recover-lr", recover.lr, "peak learning rate of those runs")->capture_default_str();
  app.add_option("-t,--threads", threads, "threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--out-dir", out_dir, "keep the quantized models here (default: a temporary folder, removed)");
  app.add_flag("--json", json, "print the table as a JSON array (one object per method or --kv entry)");
  app.add_option("--json-out", json_out, "also write the JSON array to this file");
  app.add_option("--chart", chart, "write an SVG chart: perplexity vs weight memory, marker area = tg tok/s");
  PromptCompareOptions po;
  std::string prompt_ratios, prompt_methods;
  app.add_option("--prompt-compression", prompt_ratios,
                 "compare prompt compression instead of weight methods: ratios, e.g. 1,2,4,8 (1: the whole prompt); "
                 "the target's perplexity of each --ppl-file paragraph's ending given its compressed beginning, and TTFT");
  app.add_option("--scorer", po.scorer, "with --prompt-compression: the scorer model (default: -m itself; same vocabulary)");
  app.add_option("--prompt-methods", prompt_methods,
                 "with --prompt-compression: comma-separated methods (default selective-context,llmlingua,random,tail)");
  app.add_option("--stories", po.max_stories, "with --prompt-compression: paragraphs scored (default 200)");
  app.add_option("--lead-tokens", po.lead_tokens,
                 "with --prompt-compression: the paragraphs before each, up to this many tokens, lead its prompt "
                 "(default 150; 0: the paragraph alone)");
  po.cargs.add_to(app, "");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (app.count("--prompt-compression") > 0) {
    for (const char* opt : {"--methods", "--kv", "--calib", "--calib-tokens", "--speed-only", "--out-dir", "--ppl-chunks"})
      if (app.count(opt) > 0) fail(opt, " is not for --prompt-compression (which compares prompt compression methods)");
    po.ratios = parse_ratio_list(prompt_ratios);
    for (size_t pos = 0; !prompt_methods.empty() && pos <= prompt_methods.size();) {
      const size_t end = std::min(prompt_methods.find(',', pos), prompt_methods.size());
      po.methods.push_back(prompt_methods.substr(pos, end - pos));
      pos = end + 1;
    }
    po.target = model;
    po.text_file = ppl_file;
    po.threads = threads;
    po.json = json;
    po.json_out = json_out;
    po.chart = chart;
    return run_prompt_compare(po);
  }
  for (const char* opt : {"--scorer", "--prompt-methods", "--stories", "--lead-tokens"})
    if (app.count(opt) > 0) fail(opt, " goes with --prompt-compression");
  if (app.count("--kv") > 0) {
    // The model as it is, under each K/V configuration: the methods' options mean nothing here.
    for (const char* opt : {"--methods", "--calib", "--calib-tokens", "--speed-only", "--threshold", "--alpha",
                            "--damp", "--act-order", "--group", "--ratio-of", "--out-dir", "--chart", "--ppl-chunks"})
      if (app.count(opt) > 0)
        fail(opt, " is for the compression methods' table, not --kv (which compares K/V cache configurations of the "
                  "model as it is): give one or the other");
    KvCompareOptions ko;
    ko.model = model;
    ko.text_file = ppl_file;
    ko.json_out = json_out;
    ko.n_long = kv_long;
    ko.prompt_tokens = app.count("--prompt-tokens") > 0 ? prompt_tokens : 0;
    ko.reps = reps;
    ko.threads = threads;
    ko.json = json;
    const std::vector<KvCompareEntry> entries = parse_kv_compare_list(kv_arg);  // bad entries before the model
    const int64_t n_ctx_train = read_hparams(*open_model_file(model)).n_ctx_train;
    ko.ctx = app.count("--ctx") == 0 ? std::max<int64_t>(8, std::min(ctx, n_ctx_train)) : ctx;
    if (ko.ctx > n_ctx_train)
      fail("--ctx ", ko.ctx, " is longer than ", model, "'s training context of ", n_ctx_train,
           " tokens, where perplexity means nothing: pass --ctx ", n_ctx_train,
           " or less (--kv-long N scores a longer sequence)");
    // A quarter of the context by default, so that the prompt before it is long.
    ko.gen_tokens = app.count("--gen-tokens") > 0 ? gen_tokens : std::max<int64_t>(2, std::min<int64_t>(gen_tokens, ko.ctx / 4));
    return run_kv_compare(ko, entries);
  }
  if (app.count("--kv-long") > 0) fail("--kv-long is for --kv");
  if (ppl_chunks == 0 || ppl_chunks < -1) {  // 0 chunks score nothing: the figure would be NaN
    std::fprintf(stderr, "tern compare: --ppl-chunks must be -1 (every chunk) or at least 1, got %lld\n",
                 static_cast<long long>(ppl_chunks));
    return 2;
  }

  // Validate everything before any slow work, the outputs first: a path found bad after hours
  // of quantizing and measuring would lose them.
  namespace fs = std::filesystem;
  for (const std::string* o : {&json_out, &chart}) {
    if (o->empty()) continue;
    check_output_path(*o);
    check_output_not_input(*o, {model, ppl_file, calib_file});
  }
  if (!json_out.empty() && !chart.empty()) {
    std::error_code e1, e2;
    check_output_not_input(chart, {json_out});
    if (json_out == chart || fs::weakly_canonical(json_out, e1) == fs::weakly_canonical(chart, e2))
      fail("--json-out and --chart both name ", chart, ": give them different files");
  }
  if (!out_dir.empty()) {
    std::error_code ec;
    if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) fail("--out-dir ", out_dir, " is not a directory");
  }
  auto src = open_model_file(model);
  const int64_t n_ctx_train = read_hparams(*src).n_ctx_train;
  if (app.count("--ctx") == 0) ctx = std::max<int64_t>(8, std::min(ctx, n_ctx_train));
  if (ctx > n_ctx_train && !speed_only)
    fail("--ctx ", ctx, " is longer than ", model, "'s training context of ", n_ctx_train,
         " tokens, where perplexity means nothing: pass --ctx ", n_ctx_train, " or less");
  DType src_type = DType::F32;
  for (const auto& t : src->tensors())
    if (t.ne.size() == 2) {
      src_type = t.type;
      break;
    }
  const std::vector<std::string> methods =
      methods_arg.empty() ? default_compare_methods(src_type) : split_methods(methods_arg);
  if (methods.empty()) fail("--methods is empty");
  bool need_calib = false, need_hessian = false, need_recover = false;
  // "<pruning method>+recover": the method, then a distillation toward the source (prune_recover.h).
  auto base_of = [](const std::string& m) {
    const std::string suffix = "+recover";
    const bool r = m.size() > suffix.size() && m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0;
    return std::make_pair(r ? m.substr(0, m.size() - suffix.size()) : m, r);
  };
  // "qat-TYPE": quantization-aware training of the source into TYPE (prune_recover.h), on
  // --recover-data.
  // "qat-lsq-TYPE": the same with learned scales (--qat-lsq).
  auto qat_type_of = [](const std::string& m) {
    if (m.rfind("qat-lsq-", 0) == 0) return m.substr(8);
    return m.rfind("qat-", 0) == 0 ? m.substr(4) : std::string();
  };
  bool need_training_text = false;
  for (const auto& full : methods) {
    if (kd_loss_of(full)) {
      need_training_text = true;
      continue;
    }
    if (const std::string qt = qat_type_of(full); !qt.empty()) {
      (void)parse_qat_type(qt);  // throws for an unknown type
      need_training_text = true;
      continue;
    }
    const auto [m, rec] = base_of(full);
    if (rec && !is_pruning_method(m)) fail("method '", full, "': +recover follows a pruning method (wanda-50+recover)");
    need_recover |= rec;
    const MethodInfo& info = find_method(m);  // throws for unknown names
    check_method_source(m, *src);
    const bool llm_int8 = std::string(info.name) == "llm.int8";
    need_calib |= info.needs_calib && (!speed_only || llm_int8);
    need_hessian |= info.needs_hessian && !speed_only;
  }
  if (ppl_file.empty() && !speed_only) fail("give --ppl-file TEXT (or --speed-only)");
  const std::string text = ppl_file.empty() ? std::string() : read_file_text(ppl_file, "perplexity text");
  if (calib_file.empty()) calib_file = ppl_file;
  if (need_calib && calib_file.empty()) fail("the methods need a calibration text: --calib FILE");
  if (need_recover || need_training_text) {
    recover.threads = threads;
    recover.quiet = true;
    check_recover_options(recover);
    std::error_code ec;
    if (!ppl_file.empty() && fs::equivalent(recover.data, ppl_file, ec))
      fail("--recover-data is the perplexity text ", ppl_file, ": fine-tuning on it would flatter the +recover rows");
  } else if (!recover.data.empty()) {
    fail("--recover-data is for +recover, qat- and kd- methods (e.g. wanda-50+recover, qat-q4_0, kd-feature)");
  }
  if (copts.n_tokens < 0) copts.n_tokens = speed_only ? 256 : 4096;
  mopts.search = !speed_only;
  mopts.n_threads = threads;
  copts.n_threads = threads;
  {
    CalibOptions g = copts;
    g.text_file = calib_file;
    enable_llm_pruner(mopts, g);
  }

  const bool temp_dir = out_dir.empty();
  std::error_code ec;
  const fs::path dir = temp_dir ? fs::temp_directory_path(ec) / ("tern_compare_" + std::to_string(::getpid())) : fs::path(out_dir);
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the directory ", dir.string(), ": ", ec.message());
  check_output_path((dir / "prompt.txt").string());  // writable: the models go there too
  struct Cleanup {
    fs::path dir;
    bool active;
    ~Cleanup() {
      std::error_code ec;
      if (active) fs::remove_all(dir, ec);
    }
  } cleanup{dir, temp_dir && !keep_files};

  // The prompt: the text's first prompt_tokens tokens (a fixed sentence without a text).
  const auto tok = Tokenizer::from_gguf(*src);
  std::string prompt = "Once upon a time, there was a little girl who lived in a village near the forest.";
  if (!text.empty()) {
    std::vector<int32_t> ids = tok->encode(text.substr(0, size_t(prompt_tokens) * 16), false);
    if (int64_t(ids.size()) > prompt_tokens) ids.resize(size_t(prompt_tokens));
    prompt = tok->decode(ids);
  }
  const std::string prompt_file = (dir / "prompt.txt").string();
  write_output_file(prompt_file, prompt);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string targs = threads > 0 ? " -t " + std::to_string(threads) : std::string();
  // The first row's next-token distributions are the base the others' are compared with (KL
  // divergence, same top token: tern ppl --kl-divergence), unless the file of its
  // log-probabilities would be too large to write in passing.
  const std::string kl_base = (dir / (fs::path(model).stem().string() + ".base.logp")).string();
  bool with_kl = false;
  if (!speed_only && methods.size() > 1) {
    const int64_t n_text = int64_t(tok->encode(text, tok->add_bos_default()).size());
    int64_t n_chunks = n_text / ctx;
    if (ppl_chunks > 0) n_chunks = std::min(n_chunks, ppl_chunks);
    const int64_t kl_bytes = logprob_file_bytes(read_hparams(*src).n_vocab, n_chunks * ppl_scored_per_chunk(ctx));
    with_kl = kl_bytes <= kCompareKlBaseLimit;
    if (!with_kl && !json)
      std::fprintf(stderr, "tern compare: note: no KL divergence column: the first row's log-probabilities would take %s "
                   "(give --ppl-chunks to score less)\n", format_bytes(kl_bytes).c_str());
  }
  bool kl_base_written = false;

  StagedProgress progress(!json);
  auto draw = [&](const std::string& label) { return progress.stage(label); };
  CalibStats calib;
  if (need_calib) {
    copts.text_file = calib_file;
    copts.hessian = need_hessian;
    copts.progress = draw("calibrate");
    calib = calibrate(src, copts);
    // Pruning methods recalibrate layer by layer through their pruned layers, as the papers do.
    mopts.sequential = copts;
    mopts.sequential->progress = nullptr;
    if (!json)
      std::fprintf(stderr, "calibration: %lld tokens of %s in %.1f s\n", static_cast<long long>(calib.n_tokens),
                   calib_file.c_str(), calib.seconds);
  }

  std::vector<CompareRow> rows;
  const std::string stem = fs::path(model).stem().string();
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    const auto [m, rec] = base_of(methods[mi]);
    const std::string qat_type = qat_type_of(m);
    const std::optional<std::string> kd_loss = kd_loss_of(m);
    const MethodInfo* info = qat_type.empty() && !kd_loss ? &find_method(m) : nullptr;
    CompareRow row;
    row.method = methods[mi];
    try {
    const std::string out = (dir / (stem + "-" + methods[mi] + ".gguf")).string();
    mopts.progress = draw(str_cat(info ? info->name : methods[mi].c_str(), " (", mi + 1, "/", methods.size(), ")"));
    MethodReport rep;
    if (kd_loss) {
      if (!json) std::fprintf(stderr, "%s: distilling a half-depth student (%lld tokens)\n", methods[mi].c_str(),
                              static_cast<long long>(recover.tokens));
      const int64_t t_kd = now_ns();
      kd_from_source(model, *kd_loss, out, recover);
      rep = report_of_file(out);
      rep.notes.push_back(str_cat("knowledge distillation: a student of half the layers trained from scratch on ",
                                  recover.tokens, " tokens of ", recover.data, ", loss ",
                                  kd_loss->empty() ? std::string("cross-entropy only") : *kd_loss));
      rep.seconds = double(now_ns() - t_kd) / 1e9;
    } else if (!qat_type.empty()) {
      if (!json) std::fprintf(stderr, "%s: training (%lld tokens)\n", methods[mi].c_str(), static_cast<long long>(recover.tokens));
      const int64_t t_qat = now_ns();
      qat_from_source(model, qat_type, m.rfind("qat-lsq-", 0) == 0, out, recover);
      rep = report_of_file(out);
      rep.notes.push_back(str_cat("quantization-aware training: ", recover.tokens, " tokens of ", recover.data,
                                  ", distilled from the source"));
      rep.seconds = double(now_ns() - t_qat) / 1e9;
    } else if (!rec) {
      rep = apply_method(m, model, out, need_calib ? &calib : nullptr, mopts);
    } else {
      // Prune in the source's types, recover in f32, then store as the method asked ("@type").
      const size_t at = m.find('@');
      const std::optional<DType> type =
          at == std::string::npos ? std::nullopt : std::optional<DType>(parse_quantize_type(m.substr(at + 1)));
      const std::string pruned = make_scratch_file(out, "pruned"), recovered = make_scratch_file(out, "recovered");
      rep = apply_method(m.substr(0, at), model, pruned, need_calib ? &calib : nullptr, mopts);
      if (!json) std::fprintf(stderr, "%s: recovering (%lld tokens)\n", methods[mi].c_str(), static_cast<long long>(recover.tokens));
      const int64_t t_rec = now_ns();
      recover_pruned(model, pruned, recovered, recover);
      const QuantizeReport stored = store_in_layout(
          pruned, recovered, out, type, {{"tern.prune.recover_tokens", GgufValue::u32(uint32_t(recover.tokens))}}, threads);
      std::error_code rm;
      fs::remove(pruned, rm);
      fs::remove(recovered, rm);
      rep.quant.tensors = stored.tensors;
      rep.quant.bytes = stored.bytes;
      rep.seconds += double(now_ns() - t_rec) / 1e9;
    }
    row.format = main_format(rep);
    row.weight_bytes = rep.quant.bytes;
    int64_t n_el = 0, bytes2d = 0;
    for (const auto& t : rep.quant.tensors)
      if (t.ne.size() == 2) {
        n_el += t.ne[0] * t.ne[1];
        bytes2d += t.bytes;
      }
    row.bpw = n_el > 0 ? 8.0 * double(bytes2d) / double(n_el) : 0;
    row.quantize_s = rep.seconds;
    row.n_fallbacks = rep.quant.n_fallbacks();
    set_fallbacks(row, rep.quant);
    double ratio = 0;
    int n_ratio = 0;
    for (const auto& l : rep.layers)
      if (l.err >= 0 && l.err_rtn > 0) ratio += l.err / l.err_rtn, ++n_ratio;
    if (n_ratio) row.recon_ratio = ratio / n_ratio;
    for (const auto& n : rep.notes) row.notes += (row.notes.empty() ? "" : "; ") + n;
    for (const auto& n : fallback_notes(row)) row.notes += (row.notes.empty() ? "" : "; ") + n;

    // Speed and memory: greedy generation from the fixed prompt, median of reps runs.
    std::vector<double> pp, tg, ttft, tbt;
    for (int r = 0; r < reps; ++r) {
      if (!json) std::fprintf(stderr, "%s: generating %lld tokens (run %d/%d)\n", methods[mi].c_str(),
                              static_cast<long long>(gen_tokens), r + 1, reps);
      const nlohmann::json j = run_child(self, "run -m " + shell_quote(out) + " -f " + shell_quote(prompt_file) +
                                                   " -n " + std::to_string(gen_tokens) +
                                                   " --temp 0 --ignore-eos --seed 1" + targs);
      const auto& mt = j["metrics"];
      pp.push_back(mt["prefill_tok_s"].get<double>());
      tg.push_back(mt["decode_tok_s"].get<double>());
      ttft.push_back(mt["ttft_ms"].get<double>());
      tbt.push_back(mt["tbt_ms_mean"].get<double>());
      row.peak_rss_bytes = std::max<int64_t>(row.peak_rss_bytes, mt["peak_rss_bytes"].get<int64_t>());
    }
    row.pp_tok_s = percentile(pp, 50);
    row.tg_tok_s = percentile(tg, 50);
    row.ttft_ms = percentile(ttft, 50);
    row.tbt_ms = percentile(tbt, 50);
    if (!speed_only) {
      if (!json) std::fprintf(stderr, "%s: perplexity\n", methods[mi].c_str());
      // The first row writes the base; the others compare with it when it was written.
      const bool write_base = with_kl && mi == 0, compare = with_kl && mi > 0 && kl_base_written;
      const std::string kl_args = write_base || compare ? " --kl-divergence-base " + shell_quote(kl_base) +
                                                              (compare ? " --kl-divergence" : "")
                                                        : std::string();
      const nlohmann::json j = run_child(self, "ppl -m " + shell_quote(out) + " -f " + shell_quote(ppl_file) +
                                                   " --ctx " + std::to_string(ctx) + " --chunks " +
                                                   std::to_string(ppl_chunks) + targs + kl_args);
      row.ppl = j["ppl"].get<double>();
      row.ppl_stderr = j["ppl_stderr"].get<double>();
      if (!rows.empty() && rows[0].ppl > 0) row.ppl_delta_pct = 100.0 * (row.ppl / rows[0].ppl - 1.0);
      kl_base_written |= write_base;
      if (compare) {
        row.kld = j["kl_divergence"]["kld"]["mean"].get<double>();
        row.same_top_pct = j["kl_divergence"]["same_top_pct"].get<double>();
      }
    }
    } catch (const Error& e) {
      // One method's failure (a training run, a child process) costs its row, not the table.
      row = CompareRow{};
      row.method = methods[mi];
      row.format = "failed";
      row.error = e.what();
      row.notes = e.what();
      std::fprintf(stderr, "tern compare: %s failed: %s\n", methods[mi].c_str(), e.what());
    }
    rows.push_back(row);
  }

  // What was measured is printed first: a failed write of a file must not lose the table.
  const nlohmann::json arr = rows_json(rows);
  if (json) {
    std::printf("%s\n", arr.dump().c_str());
  } else {
    std::printf("%s", markdown_table(rows).c_str());
    if (speed_only) std::printf("\n--speed-only: no perplexity; GPTQ/AWQ/SmoothQuant wrote round-to-nearest values in their formats.\n");
    for (const auto& r : rows)
      if (r.recon_ratio >= 0)
        std::printf("%s: layer output error %.1f%% of round-to-nearest's (mean over layers)\n", r.method.c_str(),
                    100.0 * r.recon_ratio);
    for (const auto& r : rows)
      for (const std::string& n : fallback_notes(r)) std::printf("note: %s\n", n.c_str());
    for (const auto& r : rows)
      if (!r.error.empty()) std::printf("failed: %s: %s\n", r.method.c_str(), r.error.c_str());
  }
  std::fflush(stdout);
  if (!json_out.empty()) write_output_file(json_out, arr.dump(2) + "\n");
  if (!chart.empty())
    write_output_file(chart, svg_chart(rows, str_cat(stem, speed_only ? ": generation speed vs weight memory"
                                                                      : ": perplexity vs weight memory")));
  const auto n_failed = std::count_if(rows.begin(), rows.end(), [](const CompareRow& r) { return !r.error.empty(); });
  return n_failed > 0 ? 1 : 0;  // the table is out; the exit status still says something failed
}

}  // namespace tern
