// tern compare --kv (kv_compare.h): per entry, a `tern ppl --long N --json` child scores the
// text's first N tokens as one sequence under the entry's K/V type and policy (its JSON gives
// the cache's capacity, bytes and peak RSS), and `tern run --json` children decode
// --gen-tokens tokens after a prompt of the text's first tokens (median decode tok/s of --reps
// runs). Bytes per token come from the model's shape and the type (models/model.h).
#include "tools/kv_compare.h"

#include "tools/kl_divergence.h"

#include <unistd.h>
#include <sys/wait.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "kv/kv_policy.h"
#include "kv/kv_store.h"
#include "models/model.h"
#include "runtime/context_fit.h"
#include "tokenizer/tokenizer.h"

namespace tern {

std::string compare_shell_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

nlohmann::json run_tern_child(const std::string& self, const std::string& args) {
  const std::string err_file = (std::filesystem::temp_directory_path() /
                                ("tern_compare_err_" + std::to_string(::getpid()))).string();
  const std::string cmd = compare_shell_quote(self) + " " + args + " --json 2>" + compare_shell_quote(err_file);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) fail("cannot run ", self);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  std::ifstream ef(err_file);
  std::stringstream es;
  es << ef.rdbuf();
  ef.close();
  std::remove(err_file.c_str());
  const std::string cmd_name = args.substr(0, args.find(' '));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string e = es.str();
    while (!e.empty() && (e.back() == '\n' || e.back() == '\r')) e.pop_back();
    const size_t nl = e.find_last_of("\r\n");
    e = e.substr(nl == std::string::npos ? 0 : nl + 1);
    if (e.empty())
      e = WIFSIGNALED(status) ? str_cat("killed by signal ", WTERMSIG(status)) : str_cat("exit status ", WEXITSTATUS(status));
    fail("tern ", cmd_name, " failed: ", e);
  }
  const size_t start = out.rfind("\n{");
  try {
    return nlohmann::json::parse(start == std::string::npos ? out : out.substr(start + 1));
  } catch (const nlohmann::json::exception&) {
    fail("tern ", cmd_name, " printed no JSON object");
  }
}

std::string KvCompareEntry::child_args() const {
  std::string a = " --kv-type " + kv_type;
  if (policy == "streaming")
    a += str_cat(" --kv-policy streaming --sinks ", sinks, " --window ", window);
  else if (policy == "h2o")
    a += str_cat(" --kv-policy h2o --sinks ", sinks, " --kv-budget ", budget);
  return a;
}

namespace {

constexpr int64_t kSinks = 4;  // StreamingLLM's and tern's default

bool is_kv_type(const std::string& s) {
  for (const KvTypeTraits& t : kv_types())
    if (s == t.name) return true;
  return false;
}

std::string type_names() {
  std::string s;
  for (const KvTypeTraits& t : kv_types()) s += std::string(s.empty() ? "" : ", ") + t.name;
  return s;
}

// A whole non-negative number (digits only), or -1.
int64_t parse_count(const std::string& s) {
  int64_t v = -1;
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() ? v : -1;
}

KvCompareEntry parse_entry(const std::string& s) {
  auto bad = [&](const std::string& why) -> KvCompareEntry {
    fail("--kv entry \"", s, "\": ", why, "; accepted: ", kv_compare_forms());
  };
  KvCompareEntry e;
  e.name = s;
  std::string type_part, policy_part;
  const size_t plus = s.find('+');
  if (plus != std::string::npos) {
    type_part = s.substr(0, plus);
    policy_part = s.substr(plus + 1);
    if (type_part.empty() || policy_part.empty()) return bad("TYPE+POLICY needs both");
    if (!is_kv_type(type_part)) return bad(str_cat("\"", type_part, "\" is not a K/V type (", type_names(), ")"));
    if (is_kv_type(policy_part)) return bad("two K/V types; after + comes a policy");
  } else if (is_kv_type(s)) {
    type_part = s;
  } else {
    policy_part = s;
  }
  if (!type_part.empty()) {
    e.kv_type = type_part;
    e.type_given = true;
  }
  if (policy_part.empty()) return e;
  if (policy_part.rfind("streaming-", 0) == 0) {
    const int64_t w = parse_count(policy_part.substr(10));
    if (w < 0) return bad("streaming-W needs W, the tokens resident, as a whole number");
    if (w <= kSinks) return bad(str_cat("streaming-W keeps ", kSinks, " sinks and W-", kSinks, " recent tokens: W must be above ", kSinks));
    e.policy = "streaming";
    e.sinks = kSinks;
    e.window = w - kSinks;
  } else if (policy_part.rfind("h2o-", 0) == 0) {
    std::string p = policy_part.substr(4);
    if (!p.empty() && p.back() == '%') p.pop_back();
    double v = 0;
    const auto r = std::from_chars(p.data(), p.data() + p.size(), v);
    if (p.empty() || r.ec != std::errc() || r.ptr != p.data() + p.size() || p.find_first_not_of("0123456789.") != std::string::npos)
      return bad("h2o-P needs P, the budget in percent of --ctx, as a number");
    if (!(v > 0 && v <= 100)) return bad("h2o-P's budget P must be above 0 and at most 100 (percent of --ctx)");
    e.policy = "h2o";
    e.sinks = kSinks;
    e.budget = p + "%";
  } else {
    return bad(type_part.empty() ? "not a K/V type or policy" : str_cat("\"", policy_part, "\" is not a policy"));
  }
  try {  // what make_kv_policy would refuse in the child
    (void)make_kv_policy(e.policy, e.sinks, e.window, e.budget);
  } catch (const Error& x) {
    return bad(x.what());
  }
  return e;
}

// The prompt of the decode test: the text's first tokens, as text that encodes to n_prompt tokens
// (BOS included when the model adds one) as near as the tokenizer allows. A text shorter than
// that is repeated (the prompt only sets the context the decode runs at).
std::string decode_prompt(const Tokenizer& tok, const std::string& text, int64_t n_prompt) {
  const bool bos = tok.add_bos_default();
  int64_t want = std::max<int64_t>(0, n_prompt - (bos ? 1 : 0));
  if (want == 0) return std::string();
  std::vector<int32_t> pool;
  for (size_t chars = size_t(want) * 16 + 256;; chars *= 2) {
    pool = tok.encode(text.substr(0, chars), false);
    if (int64_t(pool.size()) >= want + 64 || chars >= text.size()) break;
  }
  if (pool.empty()) fail("the --ppl-file text encodes to no tokens");
  const std::vector<int32_t> once = pool;
  while (int64_t(pool.size()) < want + 64) pool.insert(pool.end(), once.begin(), once.end());
  std::string prompt;
  for (int attempt = 0; attempt < 8; ++attempt) {
    prompt = tok.decode(std::vector<int32_t>(pool.begin(), pool.begin() + want));
    const int64_t got = int64_t(tok.encode(prompt, bos).size());
    if (got == n_prompt) break;
    want = std::clamp<int64_t>(want + (n_prompt - got), 1, int64_t(pool.size()));
  }
  return prompt;
}

std::string signed_fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%+.*f", prec, v);
  return b;
}

// A plain table: columns padded to their widest cell, text left-aligned, numbers right-aligned.
std::string aligned_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> w(rows[0].size(), 0);
  auto width = [](const std::string& s) {  // UTF-8 code points ("Δ")
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], width(r[c]));
  std::string out;
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    std::string line;
    for (size_t c = 0; c < rows[ri].size(); ++c) {
      const std::string& cell = rows[ri][c];
      const std::string pad(w[c] - width(cell), ' ');
      if (c) line += "  ";
      line += right[c] && ri > 0 ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string kv_compare_forms() {
  return str_cat(type_names(), " (a K/V type, the whole context cached); streaming-W (StreamingLLM: ", kSinks,
                 " sinks + the W-", kSinks, " most recent tokens); h2o-P or h2o-P% (H2O: a budget of P% of --ctx); "
                 "TYPE+POLICY (e.g. q8_0+streaming-256; a policy alone runs on f16)");
}

std::vector<KvCompareEntry> parse_kv_compare_list(const std::string& list) {
  std::vector<KvCompareEntry> v;
  std::stringstream ss(list);
  for (std::string m; std::getline(ss, m, ',');) {
    m.erase(0, m.find_first_not_of(" \t"));
    const size_t last = m.find_last_not_of(" \t");
    m.erase(last == std::string::npos ? 0 : last + 1);
    if (!m.empty()) v.push_back(parse_entry(m));
  }
  if (v.empty()) fail("--kv is empty; accepted entries: ", kv_compare_forms());
  return v;
}

int run_kv_compare(const KvCompareOptions& o, const std::vector<KvCompareEntry>& entries) {
  namespace fs = std::filesystem;
  if (entries.empty()) fail("--kv is empty; accepted entries: ", kv_compare_forms());
  if (o.text_file.empty())
    fail("give --ppl-file TEXT: --kv scores its first tokens and takes the decode test's prompt from it");
  if (!o.json_out.empty()) {
    check_output_path(o.json_out);
    check_output_not_input(o.json_out, {o.model, o.text_file});
  }
  const auto src = open_model_file(o.model);
  const HParams hp = read_hparams(*src);
  const int64_t ctx = o.ctx;
  const int64_t n_long = o.n_long > 0 ? o.n_long : ctx;
  const int64_t n_gen = o.gen_tokens;
  // The decode test ends at the context's end, after at least half of it as the prompt.
  const int64_t n_prompt = o.prompt_tokens > 0 ? o.prompt_tokens : std::max<int64_t>(ctx - n_gen - 1, ctx / 2);

  // Everything the model or --ctx refuses is found before the first measurement.
  bool any_full = false, any_default_type = false;
  for (const KvCompareEntry& e : entries) {
    const KvType type = kv_type_from_name(e.kv_type);
    try {
      check_kv_type(type, kv_rows(hp), hp.head_dim, o.model);
    } catch (const Error& x) {
      fail(e.name, ": ", x.what());
    }
    any_full |= e.policy == "none";
    any_default_type |= e.policy != "none" && !e.type_given;
    if (e.policy == "none") continue;
    if (e.policy == "streaming" && e.sinks + e.window > ctx)
      fail(e.name, ": ", e.sinks + e.window, " resident tokens do not fit --ctx ", ctx, " (give a smaller W or a larger --ctx)");
    try {
      make_kv_policy(e.policy, e.sinks, e.window, e.budget).check_fits(ctx);
    } catch (const Error& x) {
      fail(e.name, ": ", x.what());
    }
  }
  const std::string text = read_file_text(o.text_file, "perplexity text");
  if (any_full && n_long > hp.n_ctx_train)
    std::fprintf(stderr,
                 "tern compare: note: --kv-long %lld is past %s's training context of %lld tokens: the rows that cache "
                 "everything score positions it was never trained on\n",
                 static_cast<long long>(n_long), o.model.c_str(), static_cast<long long>(hp.n_ctx_train));

  std::error_code ec;
  const fs::path dir = fs::temp_directory_path(ec) / ("tern_kv_compare_" + std::to_string(::getpid()));
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the directory ", dir.string(), ": ", ec.message());
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  const auto tok = Tokenizer::from_gguf(*src);
  const std::string prompt_file = (dir / "prompt.txt").string();
  write_output_file(prompt_file, decode_prompt(*tok, text, n_prompt));
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string targs = o.threads > 0 ? " -t " + std::to_string(o.threads) : std::string();
  const std::string q_model = compare_shell_quote(o.model);

  // The first entry's distributions are the base the others' are compared with (KL divergence,
  // same top token: tern ppl --kl-divergence), unless the file of its log-probabilities would
  // be too large to write in passing.
  const int64_t kl_bytes = logprob_file_bytes(hp.n_vocab, n_long - 1);
  const bool with_kl = entries.size() > 1 && kl_bytes <= kCompareKlBaseLimit;
  const std::string kl_base = (dir / "base.logp").string();
  if (entries.size() > 1 && !with_kl)
    std::fprintf(stderr,
                 "tern compare: note: no KL divergence column: the first entry's log-probabilities would take %s "
                 "(%lld positions x %lld tokens)\n",
                 format_bytes(kl_bytes).c_str(), static_cast<long long>(n_long - 1), static_cast<long long>(hp.n_vocab));

  nlohmann::json rows = nlohmann::json::array();
  const size_t n = entries.size();
  for (size_t i = 0; i < n; ++i) {
    const KvCompareEntry& e = entries[i];
    const std::string tag = str_cat("[", i + 1, "/", n, "] ", e.name);
    auto child = [&](const std::string& args) {
      try {
        return run_tern_child(self, args);
      } catch (const Error& x) {
        fail(e.name, ": ", x.what());
      }
    };
    std::fprintf(stderr, "%s: perplexity of %lld tokens as one sequence (kv %s, policy %s)\n", tag.c_str(),
                 static_cast<long long>(n_long), e.kv_type.c_str(), e.policy.c_str());
    const std::string kl_args =
        !with_kl ? std::string() : str_cat(" --kl-divergence-base ", compare_shell_quote(kl_base), i ? " --kl-divergence" : "");
    const nlohmann::json p = child(str_cat("ppl -m ", q_model, " -f ", compare_shell_quote(o.text_file), " --ctx ", ctx,
                                           " --long ", n_long, e.child_args(), targs, kl_args));
    // Without a policy the cache holds the prompt and every generated token; with one, --ctx is
    // the context its capacity is taken from and the sequence grows past it.
    const int64_t run_ctx = e.policy == "none" ? std::max(ctx, n_prompt + n_gen + 1) : ctx;
    std::vector<double> tg;
    nlohmann::json last_run;
    for (int r = 0; r < o.reps; ++r) {
      std::fprintf(stderr, "%s: decoding %lld tokens after a %lld-token prompt (run %d/%d)\n", tag.c_str(),
                   static_cast<long long>(n_gen), static_cast<long long>(n_prompt), r + 1, o.reps);
      last_run = child(str_cat("run -m ", q_model, " -f ", compare_shell_quote(prompt_file), " -n ", n_gen, " --ctx ",
                               run_ctx, " --temp 0 --ignore-eos --seed 1", e.child_args(), targs));
      tg.push_back(last_run["metrics"]["decode_tok_s"].get<double>());
    }
    const auto& m = last_run["metrics"];
    const double ppl = p["ppl"].get<double>();
    nlohmann::json row = {{"entry", e.name},
                          {"kv_type", e.kv_type},
                          {"kv_type_default", !e.type_given && e.policy != "none"},
                          {"policy", p["kv_policy"]},
                          {"policy_kind", e.policy},
                          {"bytes_per_token", kv_bytes_per_token(hp, kv_type_from_name(e.kv_type))},
                          {"kv_capacity", p["kv_capacity"]},
                          {"kv_bytes", p["kv_bytes"]},
                          {"peak_resident", p["peak_resident"]},
                          {"n_evicted", p["n_evicted"]},
                          {"n_tokens", p["n_tokens"]},
                          {"ppl", ppl},
                          {"ppl_delta", 0.0},
                          {"ppl_delta_pct", 0.0},
                          {"segments", p["segments"]},
                          {"ppl_seconds", p["seconds"]},
                          {"peak_rss_bytes", p["peak_rss_bytes"]},
                          {"decode_tok_s", percentile(tg, 50)},
                          {"decode_runs", tg},
                          {"decode_prompt_tokens", m["n_prompt"]},
                          {"decode_gen_tokens", m["n_generated"]},
                          {"decode_ctx", run_ctx},
                          {"decode_kv_bytes", m["kv_bytes"]},
                          {"decode_peak_rss_bytes", m["peak_rss_bytes"]}};
    if (p.contains("kl_divergence")) row["kl_divergence"] = p["kl_divergence"];
    if (!rows.empty()) {
      const double base = rows[0]["ppl"].get<double>();
      row["ppl_delta"] = ppl - base;
      row["ppl_delta_pct"] = base > 0 ? 100.0 * (ppl / base - 1.0) : 0.0;
    }
    std::fprintf(stderr, "%s: ppl %.4f, %s KV, %.1f tok/s\n", tag.c_str(), ppl,
                 format_bytes(p["kv_bytes"].get<int64_t>()).c_str(), row["decode_tok_s"].get<double>());
    rows.push_back(std::move(row));
  }

  // The table first: a failed write of --json-out must not lose it.
  if (o.json) {
    std::printf("%s\n", rows.dump().c_str());
  } else {
    const int64_t shown_prompt = rows[0]["decode_prompt_tokens"].get<int64_t>();
    std::vector<std::vector<std::string>> t = {{"entry", "kv", "policy", "bytes/token", "KV tokens", "peak KV", "ppl",
                                                "Δppl vs first", "KLD vs first", "same top", str_cat("decode tok/s @", shown_prompt),
                                                "peak RSS"}};
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      char ppl[32], tg[32];
      std::snprintf(ppl, sizeof ppl, "%.4f", r["ppl"].get<double>());
      std::snprintf(tg, sizeof tg, "%.1f", r["decode_tok_s"].get<double>());
      const std::string delta = i == 0 ? std::string("baseline")
                                       : signed_fixed(r["ppl_delta"].get<double>(), 4) + " (" +
                                             signed_fixed(r["ppl_delta_pct"].get<double>(), 2) + "%)";
      std::string kld = i == 0 ? std::string("baseline") : std::string("-"), top = kld;
      if (r.contains("kl_divergence")) {
        char b[32];
        std::snprintf(b, sizeof b, "%.5f", r["kl_divergence"]["kld"]["mean"].get<double>());
        kld = b;
        std::snprintf(b, sizeof b, "%.2f%%", r["kl_divergence"]["same_top_pct"].get<double>());
        top = b;
      }
      t.push_back({r["entry"].get<std::string>(),
                   r["kv_type"].get<std::string>() + (r["kv_type_default"].get<bool>() ? "*" : ""),
                   r["policy"].get<std::string>(), str_cat(r["bytes_per_token"].get<int64_t>(), " B"),
                   str_cat(r["kv_capacity"].get<int64_t>()), format_bytes(r["kv_bytes"].get<int64_t>()), ppl, delta, kld,
                   top, tg, format_bytes(r["peak_rss_bytes"].get<int64_t>())});
    }
    std::printf("%s",
                aligned_table(t, {false, false, false, true, true, true, true, true, true, true, true, true}).c_str());
    if (any_default_type)
      std::printf("* f16: the K/V type of a policy entry without TYPE+ (e.g. q8_0+streaming-%lld for another)\n",
                  static_cast<long long>(ctx / 2));
    std::printf("ppl: the first %lld tokens of %s as one sequence, a token a step (tern ppl --long %lld --ctx %lld); "
                "KV tokens: the cache's capacity; KLD: mean KL divergence of each position's next-token distribution from the "
                "first entry's, same top: how often both put the same token first; decode: %lld tokens greedily after a %lld-token prompt, median of %d "
                "run%s; peak RSS: the ppl run's\n",
                static_cast<long long>(n_long), o.text_file.c_str(), static_cast<long long>(n_long),
                static_cast<long long>(ctx), static_cast<long long>(n_gen), static_cast<long long>(shown_prompt), o.reps,
                o.reps == 1 ? "" : "s");
  }
  std::fflush(stdout);
  if (!o.json_out.empty()) write_output_file(o.json_out, rows.dump(2) + "\n");
  return 0;
}

}  // namespace tern
