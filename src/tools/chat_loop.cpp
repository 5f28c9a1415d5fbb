#include "tools/chat_loop.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "core/stats.h"
#include "runtime/session.h"
#include "server/chat_template.h"

namespace tern {
namespace {

using server::ChatMessage;
using json = nlohmann::json;

// Exit status after Ctrl-C at the prompt, as a shell reports a process killed by SIGINT.
constexpr int kExitInterrupted = 130;

// ---- Ctrl-C --------------------------------------------------------------------------------
// The handler sets a flag the decode loop polls before each token, and writes a byte to a pipe
// that the input reader polls beside stdin (so a Ctrl-C between a check and a blocking read
// is never lost). SA_RESTART keeps the streaming writes to stdout going; poll() is not
// restarted, and the pipe wakes it in any case.

std::atomic<bool> g_interrupt{false};
std::atomic<int> g_wake_fd{-1};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "used from a signal handler");

extern "C" void on_chat_sigint(int) {
  const int saved_errno = errno;
  // A second Ctrl-C before the first was acted on (twice quickly, or during a long prefill,
  // which stops only before the first token): exit now.
  if (g_interrupt.exchange(true)) {
    const char nl = '\n';
    (void)!::write(STDOUT_FILENO, &nl, 1);
    ::_exit(kExitInterrupted);
  }
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char c = 1;
    (void)!::write(fd, &c, 1);
  }
  errno = saved_errno;
}

// Installs on_chat_sigint and its wake-up pipe for its lifetime.
class InterruptScope {
 public:
  InterruptScope() {
    if (::pipe2(fds_, O_NONBLOCK | O_CLOEXEC) != 0) fail("cannot create a pipe: ", std::strerror(errno));
    g_interrupt = false;
    g_wake_fd = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = on_chat_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &previous_);
  }
  ~InterruptScope() {
    ::sigaction(SIGINT, &previous_, nullptr);
    g_wake_fd = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Forgets a Ctrl-C that has been acted on (a stopped reply, a discarded input block).
  void clear() {
    char buf[64];
    while (::read(fds_[0], buf, sizeof buf) > 0) {
    }
    g_interrupt = false;
  }
  int wake_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction previous_ {};
};

// ---- input ---------------------------------------------------------------------------------

enum class ReadStatus { Line, Eof, Interrupted };

// Lines of a file descriptor (a terminal in canonical mode, a pipe, a file), woken by Ctrl-C.
class LineReader {
 public:
  LineReader(int fd, int wake_fd) : fd_(fd), wake_fd_(wake_fd) {}

  // The next line without its "\n" (and a "\r" before it); a last line without "\n" too.
  // Interrupted: Ctrl-C came first (a terminal drops what was typed of the line).
  ReadStatus read(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line.assign(buf_, 0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return ReadStatus::Line;
      }
      if (eof_) {
        if (buf_.empty()) return ReadStatus::Eof;
        line = std::move(buf_);
        buf_.clear();
        return ReadStatus::Line;
      }
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        fail("cannot wait for input: ", std::strerror(errno));
      }
      if (fds[1].revents & POLLIN) return ReadStatus::Interrupted;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        char tmp[4096];
        const ssize_t n = ::read(fd_, tmp, sizeof tmp);
        if (n > 0) {
          buf_.append(tmp, size_t(n));
        } else if (n == 0 || errno == EIO) {  // EIO: the terminal hung up
          eof_ = true;
        } else if (errno != EINTR && errno != EAGAIN) {
          fail("cannot read the input: ", std::strerror(errno));
        }
      }
    }
  }

 private:
  int fd_, wake_fd_;
  std::string buf_;
  bool eof_ = false;
};

ChatMessage message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}
std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// ---- the conversation ----------------------------------------------------------------------

struct Reply {
  std::string text;
  int64_t n_tokens = 0;
  std::string finish;       // "stop", "length" or "interrupted"
  int64_t n_new = 0;        // prompt tokens prefilled
  int64_t n_cached = 0;     // prompt tokens whose K/V was kept from the previous turn
  double ttft_ms = 0;
  double decode_tok_s = 0;
  uint64_t seed = 0;
};

enum class Input { Text, Command, Eof, Interrupted, Discarded };

const char* kHelp =
    "Commands:\n"
    "  /help              this list\n"
    "  /reset             start over (the system prompt stays)\n"
    "  /save FILE         write the conversation (JSON: messages, model, settings)\n"
    "  /load FILE         continue a conversation /save wrote\n"
    "  /set NAME VALUE    temp, top-k, top-p, min-p, seed (-1: random), n (reply tokens, -1: no limit),\n"
    "                     system (the system prompt; no VALUE removes it)\n"
    "  /exit              quit (also /quit, /bye, Ctrl-D)\n"
    "Input: a line ending in \\ continues on the next line; \"\"\" starts a block of lines that the\n"
    "next line ending in \"\"\" closes. A message that starts with / is written //.\n"
    "Ctrl-C stops a reply (it stays in the conversation); at the prompt it exits.\n";

class Chat {
 public:
  Chat(const ModelArgs& margs, ChatSettings settings, std::string command)
      : margs_(margs), s_(std::move(settings)), command_(std::move(command)) {
    if (s_.constraint.given()) s_.constraint.gbnf_text();  // a bad grammar fails before the model loads
    file_ = open_model_file(margs.model, margs.tokenizer_bin);
    tok_ = Tokenizer::from_gguf(*file_);
    s_.gen.constraint = s_.constraint.build(*tok_);
    ContextRequest req;
    req.kv_type = kv_type_from_name(margs.kv_type);
    req.n_ctx = margs.ctx;
    const ContextPlan plan = plan_model_context(*file_, req, command_, margs.ctx_given());
    SessionConfig cfg;
    cfg.n_ctx = plan.n_ctx;
    cfg.n_threads = margs.threads;
    cfg.n_batch = margs.batch;
    cfg.kv_type = req.kv_type;
    cfg.load = sparse_ffn_loader(margs.sparse, nullptr);  // --sparse-ffn, --ram-budget
    if (!margs.lora.empty() && !margs.sparse.ram_budget.empty()) fail(kLoraWithRamBudget);
    LoraSet lora = load_lora_args(margs.lora, *file_);
    seq_ = std::make_unique<Session>(file_, cfg);
    if (!lora.empty()) seq_->set_lora(std::move(lora));
    if (tok_->n_vocab() > seq_->hparams().n_vocab)
      fail(margs.model, ": the tokenizer has ", tok_->n_vocab(), " tokens but the model's embedding only ",
           seq_->hparams().n_vocab);
    // The template exactly as `tern serve` picks it (tools/cmd_serve.cpp).
    const auto token_text = [&](int32_t id) {
      return id >= 0 && id < tok_->n_vocab() ? tok_->tokens()[size_t(id)] : std::string();
    };
    tmpl_ = server::select_chat_template(s_.chat_template, file_->get_string("tokenizer.chat_template", ""),
                                         token_text(tok_->bos_id()), token_text(tok_->eos_id()), &template_note_);
    if (!s_.system.empty()) messages_.push_back(message("system", s_.system));
    tty_ = ::isatty(STDIN_FILENO) == 1;
  }

  int run() {
    std::fprintf(stderr, "%s: %s\n", command_.c_str(), template_note_.c_str());
    std::fprintf(stderr, "%s: context %lld tokens, KV %s (%s), %d threads%s\n", command_.c_str(),
                 static_cast<long long>(seq_->n_ctx()), format_bytes(seq_->kv_bytes()).c_str(),
                 margs_.kv_type.c_str(), seq_->n_threads(),
                 tty_ ? "; /help lists the commands, Ctrl-C stops a reply, Ctrl-D exits" : "");
    std::fflush(stderr);
    InterruptScope interrupt;
    interrupt_ = &interrupt;
    LineReader reader(STDIN_FILENO, interrupt.wake_fd());
    reader_ = &reader;
    if (!s_.first_message.empty()) {
      if (tty_) std::printf("> %s\n", s_.first_message.c_str());
      turn(s_.first_message);
    }
    for (;;) {
      std::string text;
      switch (read_input(text)) {
        case Input::Eof:
          if (tty_) std::printf("\n");
          return 0;
        case Input::Interrupted:
          if (tty_) std::printf("\n");
          return kExitInterrupted;
        case Input::Discarded:
          continue;
        case Input::Command:
          if (!command(text)) return 0;
          continue;
        case Input::Text:
          turn(text);
          continue;
      }
    }
  }

 private:
  void prompt(const char* p) {
    if (!tty_) return;
    std::fputs(p, stdout);
    std::fflush(stdout);
  }

  // One user input: a line, lines joined by a trailing backslash, or a """ block.
  Input read_input(std::string& out) {
    std::string line;
    for (;;) {
      prompt("> ");
      const ReadStatus st = reader_->read(line);
      if (st == ReadStatus::Eof) return Input::Eof;
      if (st == ReadStatus::Interrupted) return Input::Interrupted;
      if (!is_blank(line)) break;
    }
    if (starts_with(line, "\"\"\"")) {
      std::string rest = line.substr(3);
      if (rest.size() >= 3 && ends_with(rest, "\"\"\"")) {
        out = rest.substr(0, rest.size() - 3);
        return Input::Text;
      }
      std::vector<std::string> parts;
      if (!rest.empty()) parts.push_back(rest);
      for (;;) {
        prompt("... ");
        const ReadStatus st = reader_->read(line);
        if (st == ReadStatus::Eof) break;  // end of input closes the block
        if (st == ReadStatus::Interrupted) return discarded();
        if (ends_with(line, "\"\"\"")) {
          line.resize(line.size() - 3);
          if (!line.empty()) parts.push_back(line);
          break;
        }
        parts.push_back(line);
      }
      out.clear();
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? "\n" : "") + parts[i];
      if (is_blank(out)) return Input::Discarded;
      return Input::Text;
    }
    out = line;
    while (ends_with(out, "\\")) {
      out.back() = '\n';
      prompt("... ");
      const ReadStatus st = reader_->read(line);
      if (st == ReadStatus::Eof) break;
      if (st == ReadStatus::Interrupted) return discarded();
      out += line;
    }
    if (starts_with(out, "//")) {
      out.erase(0, 1);
      return Input::Text;
    }
    return starts_with(out, "/") ? Input::Command : Input::Text;
  }

  Input discarded() {
    interrupt_->clear();
    if (tty_) std::printf("\n");
    std::fprintf(stderr, "(input discarded)\n");
    return Input::Discarded;
  }

  void error(const std::string& what) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", command_.c_str(), what.c_str());
    std::fflush(stderr);
  }
  void note(const std::string& what) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", command_.c_str(), what.c_str());
    std::fflush(stderr);
  }

  // Returns false to end the conversation.
  bool command(const std::string& line) {
    const size_t sp = line.find_first_of(" \t");
    const std::string name = line.substr(0, sp);
    const std::string arg = sp == std::string::npos ? "" : trim(line.substr(sp));
    try {
      if (name == "/exit" || name == "/quit" || name == "/bye") return false;
      if (name == "/help" || name == "/?") {
        std::fflush(stdout);
        std::fputs(kHelp, stderr);
      } else if (name == "/reset" || name == "/clear") {
        std::vector<ChatMessage> kept;
        for (const ChatMessage& m : messages_) {
          if (m.role != "system") break;
          kept.push_back(m);
        }
        messages_ = std::move(kept);
        note("the conversation is cleared" + std::string(messages_.empty() ? "" : " (the system prompt stays)"));
      } else if (name == "/save") {
        if (arg.empty()) fail("/save needs a file name: /save FILE");
        save(arg);
      } else if (name == "/load") {
        if (arg.empty()) fail("/load needs a file name: /load FILE");
        load(arg);
      } else if (name == "/set") {
        set(arg);
      } else {
        fail("unknown command ", name, " (/help lists them; a message that starts with / is written //)");
      }
    } catch (const Error& e) {
      error(e.what());
    }
    return true;
  }

  json settings_json() const {
    const SamplingParams& sp = s_.gen.sampling;
    // A float's shortest decimal ("0.95", not its double's 0.949999988...).
    const auto f = [](float x) { return std::strtod(str_cat(x).c_str(), nullptr); };
    return {{"chat_template", tmpl_.name()}, {"temperature", f(sp.temperature)}, {"top_k", sp.top_k},
            {"top_p", f(sp.top_p)},          {"min_p", f(sp.min_p)},          {"repeat_penalty", f(sp.repeat_penalty)},
            {"n_predict", s_.gen.n_predict}, {"seed", s_.seed},              {"n_ctx", seq_->n_ctx()}};
  }

  void save(const std::string& path) {
    json msgs = json::array();
    for (const ChatMessage& m : messages_) msgs.push_back({{"role", m.role}, {"content", m.content}});
    const json j = {{"format", "tern-chat"}, {"version", 1},
                    {"model", margs_.model}, {"settings", settings_json()},
                    {"messages", msgs}};
    const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    OutputFile out(path);  // replaces the file whole or not at all
    out.write(text);
    out.commit();
    note("saved " + std::to_string(messages_.size()) + " messages to " + path);
  }

  void load(const std::string& path) {
    const std::string text = read_file_text(path, "conversation file");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail(path, " is not a conversation file: it is not JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array())
      fail(path, " is not a conversation file: it has no \"messages\" array (as /save writes)");
    std::vector<ChatMessage> msgs;
    const json& arr = j["messages"];
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& m = arr[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        fail(path, ": messages[", i, "] is not {\"role\": string, \"content\": string}");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant")
        fail(path, ": messages[", i, "] has role \"", role, "\" (system, user or assistant)");
      msgs.push_back(message(role, m["content"].get<std::string>()));
    }
    if (!msgs.empty() && msgs.back().role == "user")
      fail(path, ": the last message is the user's, with no reply (a conversation to continue ends with a reply)");
    // The template must be able to go on with it (a family can refuse an order of roles).
    std::vector<ChatMessage> probe = msgs;
    probe.push_back(message("user", "?"));
    try {
      (void)tmpl_.encode(probe, *tok_, tok_->add_bos_default());
    } catch (const Error& e) {
      fail(path, ": the chat template (", tmpl_.name(), ") cannot continue this conversation: ", e.what());
    }
    messages_ = std::move(msgs);
    std::string msg = "loaded " + std::to_string(messages_.size()) + " messages from " + path;
    if (j.contains("model") && j["model"].is_string() && j["model"].get<std::string>() != margs_.model)
      msg += " (saved with the model " + j["model"].get<std::string>() + ")";
    note(msg);
  }

  static double parse_number(const std::string& name, const std::string& v) {
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE)
      fail("/set ", name, ": \"", v, "\" is not a number");
    return x;
  }

  void set(const std::string& arg) {
    const size_t sp = arg.find_first_of(" \t");
    const std::string name = arg.substr(0, sp);
    const std::string value = sp == std::string::npos ? "" : trim(arg.substr(sp));
    if (name.empty()) fail("/set needs a setting: /set NAME VALUE (/help lists them)");
    if (name == "system") {
      if (!messages_.empty() && messages_[0].role == "system") messages_.erase(messages_.begin());
      if (!value.empty()) messages_.insert(messages_.begin(), message("system", value));
      s_.system = value;
      note(value.empty() ? "no system prompt" : "system prompt set");
      return;
    }
    if (value.empty()) fail("/set ", name, " needs a value");
    const double x = parse_number(name, value);
    ChatSettings next = s_;
    SamplingParams& p = next.gen.sampling;
    const auto whole = [&](double lo, double hi) {
      if (x != double(int64_t(x)) || x < lo || x > hi) fail("/set ", name, ": ", value, " is not a whole number in [", lo, ", ", hi, "]");
      return int64_t(x);
    };
    if (name == "temp" || name == "temperature") p.temperature = float(x);
    else if (name == "top-k" || name == "top_k") p.top_k = int32_t(whole(0, 1 << 30));
    else if (name == "top-p" || name == "top_p") p.top_p = float(x);
    else if (name == "min-p" || name == "min_p") p.min_p = float(x);
    else if (name == "seed") next.seed = whole(-1, 9.0e15);
    else if (name == "n" || name == "n-predict") next.gen.n_predict = whole(-1, double(1 << 24));
    else fail("/set: unknown setting \"", name, "\" (temp, top-k, top-p, min-p, seed, n, system)");
    p.validate();
    if (next.gen.n_predict == 0) fail("/set n 0 would give empty replies: give 1 or more, or -1 for no limit");
    s_ = std::move(next);
    note(name + " = " + value);
  }

  std::vector<int32_t> encode(const std::vector<ChatMessage>& msgs) const {
    return tmpl_.encode(msgs, *tok_, tok_->add_bos_default());
  }

  // The prompt for `msgs` (ending with the user's new message), dropping the oldest turns
  // (a user message and the replies after it; the leading system messages stay) while the
  // prompt and the room kept for the reply exceed the context. Throws when even the newest
  // message alone does not fit.
  std::vector<int32_t> fit_context(std::vector<ChatMessage>& msgs) {
    const int64_t n_ctx = seq_->n_ctx();
    const int64_t budget = s_.gen.n_predict > 0 ? s_.gen.n_predict : n_ctx / 4;
    const int64_t reserve = std::min(budget, n_ctx / 2);
    std::vector<int32_t> ids = encode(msgs);
    const int64_t n_before = int64_t(ids.size());
    int n_turns = 0;
    size_t n_msgs = 0;
    while (int64_t(ids.size()) + reserve > n_ctx) {
      size_t i0 = 0;
      while (i0 < msgs.size() && msgs[i0].role == "system") ++i0;
      const size_t last = msgs.size() - 1;  // the message being answered stays
      if (i0 >= last) break;
      size_t j = i0 + 1;
      while (j < last && msgs[j].role != "user") ++j;
      msgs.erase(msgs.begin() + std::ptrdiff_t(i0), msgs.begin() + std::ptrdiff_t(j));
      ++n_turns;
      n_msgs += j - i0;
      ids = encode(msgs);
    }
    if (int64_t(ids.size()) >= n_ctx)
      fail("this message makes a prompt of ", ids.size(), " tokens", n_turns ? " even alone" : "",
           " but the context holds ", n_ctx, ": it was not sent (shorten it, or raise --ctx)");
    if (n_turns > 0)
      note(str_cat("the conversation (", n_before, " tokens + ", reserve, " kept for the reply) outgrew the context of ",
                   n_ctx, " tokens: dropped the oldest ", n_turns, n_turns == 1 ? " turn (" : " turns (", n_msgs,
                   " messages)", msgs.front().role == "system" ? ", kept the system prompt" : "", "; the prompt is now ",
                   ids.size(), " tokens"));
    return ids;
  }

  void turn(const std::string& text) {
    streamed_ = false;
    std::vector<ChatMessage> msgs = messages_;
    msgs.push_back(message("user", text));
    std::vector<int32_t> ids;
    Reply r;
    try {
      ids = fit_context(msgs);
      r = reply(ids);
    } catch (const Error& e) {
      // Nothing of this turn stays (the cache is left consistent by Session).
      interrupt_->clear();
      if (streamed_) std::printf("\n");
      error(e.what());
      return;
    }
    interrupt_->clear();
    msgs.push_back(message("assistant", r.text));
    messages_ = std::move(msgs);
    std::printf("\n");
    std::fflush(stdout);
    if (s_.metrics) {
      std::string seed;
      if (s_.seed < 0 && s_.gen.sampling.temperature > 0) seed = str_cat(" | seed ", r.seed);
      std::fprintf(stderr, "[reply %lld tokens (%s) | prompt %lld new + %lld cached | TTFT %.2f ms | %.1f tok/s%s]\n",
                   static_cast<long long>(r.n_tokens), r.finish.c_str(), static_cast<long long>(r.n_new),
                   static_cast<long long>(r.n_cached), r.ttft_ms, r.decode_tok_s, seed.c_str());
    } else if (r.finish == "interrupted") {
      std::fprintf(stderr, "[interrupted]\n");
    }
    std::fflush(stderr);
  }

  // Prefill of the prompt's new tokens, then the decode loop (runtime/generate.cpp's, on a
  // sequence that keeps the shared prefix), streaming the text to stdout.
  Reply reply(const std::vector<int32_t>& prompt) {
    const int64_t n_prompt = int64_t(prompt.size());
    if (n_prompt == 0) fail("the prompt has no tokens");
    // The K/V kept: the tokens shared with what the cache holds, but only those a prefill
    // computed. A previous reply's tokens were computed one at a time, and the single-token
    // kernels of quantized weights round differently from a prefill's (docs/architecture.md):
    // kept, they would make a reply depend on how the conversation was reached, not only on
    // its text, and differ from the server's answer to the same messages. They are prefilled
    // once, with the new message.
    const std::vector<int32_t>& held = seq_->tokens();
    const int64_t lim = std::min<int64_t>(seq_->n_batched(), n_prompt);
    int64_t p = 0;
    while (p < lim && held[size_t(p)] == prompt[size_t(p)]) ++p;
    // At least two new tokens, for the same reason (a prompt of one token is one anyway).
    if (n_prompt - p < 2) p = std::max<int64_t>(0, n_prompt - 2);
    seq_->truncate(p);

    Reply r;
    r.n_cached = p;
    r.n_new = n_prompt - p;
    r.finish = "length";
    SamplingParams sp = s_.gen.sampling;
    sp.seed = s_.seed >= 0 ? uint64_t(s_.seed) : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    r.seed = sp.seed;
    const int32_t n_vocab = int32_t(seq_->hparams().n_vocab);
    Sampler sampler(sp, n_vocab);
    // The reply's grammar state: a fresh clone, so every reply is one complete match.
    std::unique_ptr<TokenConstraint> constraint = s_.gen.constraint ? s_.gen.constraint->clone() : nullptr;
    std::vector<float> masked(constraint ? size_t(n_vocab) : 0);  // [n_vocab] the constrained logits row
    StreamDecoder decoder(*tok_);
    const std::vector<std::string>& stops = s_.gen.stop;
    std::vector<int32_t> history = prompt;
    std::string full;   // the reply so far, before stop trimming
    size_t emitted = 0;  // bytes of `full` written to stdout
    const auto emit = [&](size_t upto) {
      if (upto <= emitted) return;
      streamed_ = true;
      std::fwrite(full.data() + emitted, 1, upto - emitted, stdout);
      std::fflush(stdout);
      emitted = upto;
    };

    const int64_t t0 = now_ns();
    const float* logits = seq_->eval(std::span<const int32_t>(prompt).subspan(size_t(p)));
    int64_t limit = seq_->n_ctx() - n_prompt;  // as the server clips max_tokens
    if (s_.gen.n_predict > 0) limit = std::min(limit, s_.gen.n_predict);
    int64_t t_last = 0;
    double tbt_sum = 0;
    for (int64_t n = 0; n < limit; ++n) {
      if (g_interrupt.load(std::memory_order_relaxed)) {
        r.finish = "interrupted";
        break;
      }
      int32_t id;
      if (constraint) {
        masked.assign(logits, logits + n_vocab);
        constraint->apply(masked.data(), n_vocab);
        id = sampler.sample(masked.data(), history);
        constraint->accept(id);
      } else {
        id = sampler.sample(logits, history);
      }
      const int64_t t = now_ns();
      if (n == 0) r.ttft_ms = double(t - t0) / 1e6;
      else tbt_sum += double(t - t_last) / 1e6;
      t_last = t;
      ++r.n_tokens;
      history.push_back(id);
      // Under a grammar, end of generation ends the reply even with --ignore-eos (as tern run).
      if ((!s_.gen.ignore_eos || constraint) && tok_->is_eog(id)) {
        r.finish = "stop";
        break;
      }
      full += decoder.push(id);
      const size_t stop_at = find_stop(full, stops);
      if (stop_at != std::string::npos) {
        full.resize(stop_at);
        emit(full.size());
        r.finish = "stop";
        break;
      }
      emit(full.size() - stop_holdback(full, stops));
      if (constraint && constraint->is_dead()) {
        // Nothing may follow the match: the reply is complete.
        full += decoder.flush();
        emit(full.size());
        r.finish = "stop";
        break;
      }
      if (n + 1 == limit) break;
      logits = seq_->eval(std::span<const int32_t>(&id, 1));
    }
    if (r.finish != "stop") full += decoder.flush();
    emit(full.size());
    r.text = std::move(full);
    r.decode_tok_s = tbt_sum > 0 ? double(r.n_tokens - 1) / (tbt_sum / 1e3) : 0;
    return r;
  }

  const ModelArgs& margs_;
  ChatSettings s_;
  std::string command_;
  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Session> seq_;  // the conversation's one sequence, cut back to the common prefix each turn
  server::ChatTemplate tmpl_;
  std::string template_note_;
  std::vector<ChatMessage> messages_;
  bool tty_ = false;
  bool streamed_ = false;  // the reply being generated has written text
  InterruptScope* interrupt_ = nullptr;
  LineReader* reader_ = nullptr;
};

}  // namespace

void add_chat_flags(CLI::App& app, ChatSettings& s, const std::string& help_suffix) {
  app.add_option("--system", s.system, "system prompt (the conversation's first message)" + help_suffix);
  app.add_option("--chat-template", s.chat_template,
                 "chatml|llama2|llama3|mistral|phi3|zephyr|gemma (a built-in template), or a file with a Jinja "
                 "template (default: the model's tokenizer.chat_template, else chatml), as tern serve" +
                     help_suffix);
  app.add_flag("--no-metrics", [&s](int64_t) { s.metrics = false; }, "no metrics line after each reply" + help_suffix);
}

int run_chat(const ModelArgs& margs, ChatSettings settings, const std::string& command) {
  settings.gen.sampling.validate();
  if (settings.gen.n_predict == 0) fail("-n 0 would give empty replies: give -n 1 or more, or -1 for no limit");
  Chat chat(margs, std::move(settings), command);
  return chat.run();
}

}  // namespace tern
