#include "server/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/api_error.h"

namespace tern::server {

namespace {

// A rendered conversation as runs of template text (role markers, separators: special-token
// texts in them are special tokens) and message content (always text).
struct Piece {
  std::string text;
  bool content = false;
};
using Pieces = std::vector<Piece>;

void add(Pieces& out, std::string_view text, bool content) {
  if (text.empty()) return;
  if (!out.empty() && out.back().content == content) out.back().text += text;
  else out.push_back({std::string(text), content});
}
void add_template(Pieces& out, std::string_view text) { add(out, text, false); }
void add_all(Pieces& out, const Pieces& more) {
  for (const Piece& p : more) add(out, p.text, p.content);
}

// One message, its content possibly already wrapped in template text (a folded system prompt).
struct Turn {
  std::string role;
  Pieces content;
};

std::vector<Turn> to_turns(const std::vector<ChatMessage>& msgs) {
  std::vector<Turn> out;
  for (const auto& m : msgs) {
    Turn t{m.role, {}};
    add(t.content, m.content, true);
    out.push_back(std::move(t));
  }
  return out;
}

// Python's str.strip(), which the Llama-2/3 and Gemma templates apply to message contents,
// over the whole run of pieces (the Llama-2 system block is stripped with its user message).
Pieces strip(Pieces p) {
  const char* ws = " \t\n\r\f\v";
  while (!p.empty()) {
    const size_t b = p.front().text.find_first_not_of(ws);
    if (b != std::string::npos) {
      p.front().text.erase(0, b);
      break;
    }
    p.erase(p.begin());
  }
  while (!p.empty()) {
    const size_t e = p.back().text.find_last_not_of(ws);
    if (e != std::string::npos) {
      p.back().text.resize(e + 1);
      break;
    }
    p.pop_back();
  }
  return p;
}

// Llama-2, Mistral and Gemma templates raise unless the turns go system?, user, assistant,
// user, ...; the same conversations are refused here with a 400 instead of a 500.
void require_alternation(const std::vector<ChatMessage>& msgs, const char* family) {
  size_t i = 0;
  if (!msgs.empty() && msgs[0].role == "system") i = 1;
  for (size_t k = i; k < msgs.size(); ++k) {
    const char* want = (k - i) % 2 == 0 ? "user" : "assistant";
    if (msgs[k].role != want)
      bad_request("messages", "the ", family, " chat template needs the roles to go (system), user, assistant, user, ...;"
                  " messages[", k, "] is '", msgs[k].role, "'.");
  }
  if (i == msgs.size()) bad_request("messages", "the ", family, " chat template needs at least one user message.");
}

// The system prompt folded into the first user turn, as llama.cpp does for templates without
// a system role.
std::vector<Turn> fold_system(const std::vector<ChatMessage>& msgs) {
  std::vector<Turn> turns = to_turns(msgs);
  if (turns.empty() || turns[0].role != "system" || turns.size() < 2) return turns;
  Pieces first = turns[0].content;
  add_template(first, "\n\n");
  add_all(first, turns[1].content);
  turns[1].content = std::move(first);
  turns.erase(turns.begin());
  return turns;
}

// The families whose turns are each a header naming the role, the content and an end
// marker, with the assistant's header last (the generation prompt).
struct RoleBlocks {
  std::string header_open, header_close;  // around the role's name
  std::string end;                         // after the content
  bool strip = false;                      // content trimmed of surrounding whitespace
  std::string assistant_role = "assistant";  // the name the template gives the assistant
};

Pieces render_role_blocks(const std::vector<Turn>& turns, const RoleBlocks& f) {
  Pieces out;
  for (const auto& t : turns) {
    add_template(out, f.header_open + (t.role == "assistant" ? f.assistant_role : t.role) + f.header_close);
    add_all(out, f.strip ? strip(t.content) : t.content);
    add_template(out, f.end);
  }
  add_template(out, f.header_open + f.assistant_role + f.header_close);
  return out;
}

Pieces render_llama2(const std::vector<ChatMessage>& msgs, const std::string& bos, const std::string& eos) {
  require_alternation(msgs, "Llama-2");
  const std::vector<Turn> turns = to_turns(msgs);
  size_t i = 0;
  if (turns[0].role == "system") i = 1;
  Pieces out;
  for (size_t k = i; k < turns.size(); ++k) {
    Pieces content;
    if (k == i && i == 1) {
      add_template(content, "<<SYS>>\n");
      add_all(content, turns[0].content);
      add_template(content, "\n<</SYS>>\n\n");
    }
    add_all(content, turns[k].content);
    if (turns[k].role == "user") {
      if (k != i) add_template(out, bos);
      add_template(out, "[INST] ");
      add_all(out, strip(std::move(content)));
      add_template(out, " [/INST]");
    } else {
      add_template(out, " ");
      add_all(out, strip(std::move(content)));
      add_template(out, " " + eos);
    }
  }
  return out;
}

Pieces render_mistral(const std::vector<ChatMessage>& msgs, const std::string& eos) {
  require_alternation(msgs, "Mistral");
  Pieces out;
  for (const auto& t : fold_system(msgs)) {
    if (t.role == "user") {
      add_template(out, "[INST] ");
      add_all(out, t.content);
      add_template(out, " [/INST]");
    } else {
      add_all(out, t.content);
      add_template(out, eos);
    }
  }
  return out;
}

// A tool as HF's templates get it: {"type": "function", "function": {name, description, parameters}}.
nlohmann::ordered_json tool_json(const ToolDef& d) {
  nlohmann::ordered_json fn = nlohmann::ordered_json::object();
  fn["name"] = d.name;
  if (!d.description.empty()) fn["description"] = d.description;
  fn["parameters"] = d.parameters;
  return {{"type", "function"}, {"function", std::move(fn)}};
}

// JSON text as Python's json.dumps writes it (", " and ": "), the way templates' tojson shows
// arguments; text that is not JSON is returned as it is.
std::string python_json_text(const std::string& text) {
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return text;
  return jinja::to_json(jinja::from_json(j), -1);
}

// A JSON document as a template value, every string marked (it came from the request).
jinja::Value request_value(const nlohmann::ordered_json& j) { return jinja::from_json(j, /*mark=*/true); }

jinja::Value marked(const std::string& s) { return jinja::Value(jinja::Text(s, true)); }

// The variables HF's apply_chat_template gives a template, for these messages and tools; every
// string that comes from the request is marked (content, never special tokens). Messages carry
// what OpenAI's do, in HF's shape: content a string ("" when null), tool_calls [{id, type,
// function: {name, arguments}}] with the arguments as an object (as HF's templates expect and llama.cpp passes them), and
// tool_call_id and name for role "tool". Tools: [{type: "function", function: {name,
// description, parameters}}], or none.
jinja::Object jinja_vars(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                         const std::vector<ToolDef>& tools) {
  jinja::Array msgs;
  for (const ChatMessage& m : messages) {
    jinja::Object o;
    o.set("role", marked(m.role));
    // A null content beside tool_calls is "" to the template, as llama.cpp passes it: Qwen's
    // templates test `'</think>' in message.content`, which fails on none.
    o.set("content", marked(m.content));
    if (!m.tool_calls.empty()) {
      jinja::Array calls;
      for (const ToolCall& c : m.tool_calls) {
        jinja::Object fn;
        fn.set("name", marked(c.name));
        const auto args = nlohmann::ordered_json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        fn.set("arguments", args.is_discarded() ? marked(c.arguments) : request_value(args));
        jinja::Object call;
        call.set("id", marked(c.id));
        call.set("type", marked("function"));
        call.set("function", jinja::Value::object(std::move(fn)));
        calls.push_back(jinja::Value::object(std::move(call)));
      }
      o.set("tool_calls", jinja::Value::array(std::move(calls)));
    }
    if (m.role == "tool") o.set("tool_call_id", marked(m.tool_call_id));
    if (!m.name.empty()) o.set("name", marked(m.name));
    msgs.push_back(jinja::Value::object(std::move(o)));
  }
  jinja::Object vars;
  vars.set("messages", jinja::Value::array(std::move(msgs)));
  vars.set("add_generation_prompt", jinja::Value(true));
  vars.set("bos_token", jinja::Value(t.bos_text));
  vars.set("eos_token", jinja::Value(t.eos_text));
  if (tools.empty()) {
    vars.set("tools", jinja::Value::none());
  } else {
    jinja::Array list;
    for (const ToolDef& d : tools) list.push_back(request_value(tool_json(d)));
    vars.set("tools", jinja::Value::array(std::move(list)));
  }
  return vars;
}

Pieces render_jinja(const ChatTemplate& t, const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools) {
  jinja::Text out;
  try {
    out = t.jinja->render(jinja_vars(t, messages, tools));
  } catch (const jinja::TemplateError& e) {
    if (e.raised()) bad_request("messages", "the model's chat template refuses this conversation: ", e.message());
    throw ApiError(500, "server_error", "", "", str_cat("the model's chat template failed to render: ", e.what()));
  }
  // The server adds BOS while tokenizing; a BOS text the template writes first is dropped.
  size_t pos = 0;
  if (!t.bos_text.empty() && out.str().starts_with(t.bos_text) && !out.marked_at(0)) pos = t.bos_text.size();
  Pieces pieces;
  for (const auto& [b, e] : out.marks()) {
    if (e <= pos) continue;
    const size_t from = std::max(b, pos);
    add_template(pieces, std::string_view(out.str()).substr(pos, from - pos));
    add(pieces, std::string_view(out.str()).substr(from, e - from), true);
    pos = e;
  }
  add_template(pieces, std::string_view(out.str()).substr(pos));
  return pieces;
}

// The generic scheme (ChatTemplate::jinja_tools false): tools described in the system message,
// calls and results written into plain messages, in hermes' syntax (generic_tools_prompt).
std::vector<ChatMessage> generic_tool_messages(const std::vector<ChatMessage>& in, const std::vector<ToolDef>& tools) {
  std::vector<ChatMessage> out;
  if (!tools.empty()) {
    const std::string block = generic_tools_prompt(tools);
    if (!in.empty() && in[0].role == "system") out.push_back({"system", in[0].content + "\n\n" + block});
    else out.push_back({"system", block});
  }
  for (size_t i = (!tools.empty() && !in.empty() && in[0].role == "system") ? 1 : 0; i < in.size(); ++i) {
    const ChatMessage& m = in[i];
    if (m.role == "tool") {
      std::string block = "<tool_response>\n" + m.content + "\n</tool_response>";
      if (i > 0 && in[i - 1].role == "tool") out.back().content += "\n" + block;
      else out.push_back({"user", std::move(block)});
      continue;
    }
    if (m.tool_calls.empty()) {
      // A user message right after tool results joins their turn: families that need the
      // roles to alternate see one user turn.
      if (m.role == "user" && i > 0 && in[i - 1].role == "tool") out.back().content += "\n\n" + m.content;
      else out.push_back({m.role, m.content});
      continue;
    }
    std::string content = m.content;
    for (const ToolCall& c : m.tool_calls) {
      if (!content.empty()) content += "\n";
      content += "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + python_json_text(c.arguments) +
                 "}\n</tool_call>";
    }
    out.push_back({m.role, std::move(content)});
  }
  return out;
}

bool uses_tools(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools) {
  return !tools.empty() || std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
           return m.role == "tool" || !m.tool_calls.empty();
         });
}

Pieces render_plain(const ChatTemplate& t, const std::vector<ChatMessage>& messages);

Pieces render(const ChatTemplate& t, const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools) {
  if (messages.empty()) bad_request("messages", "'messages' must contain at least one message.");
  if (t.jinja && t.jinja_tools) return render_jinja(t, messages, tools);
  if (uses_tools(messages, tools)) return render_plain(t, generic_tool_messages(messages, tools));
  return render_plain(t, messages);
}

Pieces render_plain(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  if (t.jinja) return render_jinja(t, messages, {});
  switch (t.family) {
    case ChatFamily::ChatML: break;
    case ChatFamily::Llama2: return render_llama2(messages, t.bos_text, t.eos_text);
    case ChatFamily::Llama3:
      return render_role_blocks(to_turns(messages), {"<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true});
    case ChatFamily::Mistral: return render_mistral(messages, t.eos_text);
    case ChatFamily::Phi3: return render_role_blocks(to_turns(messages), {"<|", "|>\n", "<|end|>\n"});
    case ChatFamily::Zephyr: return render_role_blocks(to_turns(messages), {"<|", "|>\n", t.eos_text + "\n"});
    case ChatFamily::Gemma:
      require_alternation(messages, "Gemma");
      return render_role_blocks(fold_system(messages), {"<start_of_turn>", "\n", "<end_of_turn>\n", true, "model"});
  }
  return render_role_blocks(to_turns(messages), {"<|im_start|>", "\n", "<|im_end|>\n"});
}

// The tokenizer's special tokens as Tokenizer::encode(..., parse_special = true) splits them
// out of a text: control, unknown and user-defined tokens with a text, longest text first.
std::vector<int32_t> special_tokens(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  const auto& types = tok.token_types();
  const auto& texts = tok.tokens();
  for (size_t i = 0; i < types.size() && i < texts.size(); ++i) {
    const auto t = static_cast<TokenType>(types[i]);
    if ((t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined) && !texts[i].empty())
      ids.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return texts[a].size() > texts[b].size(); });
  return ids;
}

// A piece of template text split at special-token texts: tokens (>= 0) and text runs (-1).
struct Part {
  int32_t token;
  std::string text;
};

std::vector<Part> split_specials(const std::string& text, const Tokenizer& tok, const std::vector<int32_t>& specials) {
  std::vector<Part> parts{{-1, text}};
  for (int32_t id : specials) {
    const std::string& needle = tok.tokens()[size_t(id)];
    std::vector<Part> next;
    for (Part& p : parts) {
      if (p.token >= 0 || p.text.find(needle) == std::string::npos) {
        next.push_back(std::move(p));
        continue;
      }
      size_t pos = 0;
      for (size_t hit; (hit = p.text.find(needle, pos)) != std::string::npos; pos = hit + needle.size()) {
        if (hit > pos) next.push_back({-1, p.text.substr(pos, hit - pos)});
        next.push_back({id, {}});
      }
      if (pos < p.text.size()) next.push_back({-1, p.text.substr(pos)});
    }
    parts = std::move(next);
  }
  return parts;
}

}  // namespace

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Mistral: return "mistral";
    case ChatFamily::Phi3: return "phi3";
    case ChatFamily::Zephyr: return "zephyr";
    case ChatFamily::Gemma: return "gemma";
  }
  return "?";
}

std::optional<ChatFamily> chat_family_from_name(std::string_view name) {
  if (name == "chatml" || name == "qwen") return ChatFamily::ChatML;
  if (name == "llama2" || name == "llama-2") return ChatFamily::Llama2;
  if (name == "llama3" || name == "llama-3") return ChatFamily::Llama3;
  if (name == "mistral") return ChatFamily::Mistral;
  if (name == "phi3" || name == "phi-3") return ChatFamily::Phi3;
  if (name == "zephyr") return ChatFamily::Zephyr;
  if (name == "gemma") return ChatFamily::Gemma;
  return std::nullopt;
}

std::optional<ChatFamily> detect_chat_template(std::string_view t) {
  auto has = [&](std::string_view marker) { return t.find(marker) != std::string_view::npos; };
  // Most specific markers first: a ChatML or Llama-3 template may mention [INST] in a comment,
  // never the other way round.
  if (has("<|im_start|>")) return ChatFamily::ChatML;
  if (has("<|start_header_id|>")) return ChatFamily::Llama3;
  if (has("<start_of_turn>")) return ChatFamily::Gemma;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFamily::Llama2 : ChatFamily::Mistral;
  if (has("<|assistant|>") || has("<|user|>")) return has("<|end|>") ? ChatFamily::Phi3 : ChatFamily::Zephyr;
  return std::nullopt;
}

std::string ChatTemplate::name() const { return jinja ? "jinja" : chat_family_name(family); }

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools) const {
  std::string out;
  for (const Piece& p : render(*this, messages, tools)) out += p.text;
  return out;
}

std::vector<int32_t> ChatTemplate::encode(const std::vector<ChatMessage>& messages, const Tokenizer& tok,
                                          bool add_bos, const std::vector<ToolDef>& tools) const {
  const Pieces pieces = render(*this, messages, tools);
  const std::vector<int32_t> specials = special_tokens(tok);
  std::vector<int32_t> out;
  if (add_bos) {
    if (tok.bos_id() < 0) fail("this tokenizer has no BOS token");
    out.push_back(tok.bos_id());
  }
  // Text between special tokens is tokenized as one run, whichever pieces it spans, so that a
  // conversation without special-token texts in its contents gets exactly the ids of
  // encode(apply(messages), add_bos, true): merges cross the template/content boundaries the
  // same way, and each run starts after a special token (SPM's space prefix) as it does there.
  std::string run;
  const auto flush = [&] {
    if (run.empty()) return;
    const std::vector<int32_t> ids = tok.encode(run, /*add_bos=*/false, /*parse_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
    run.clear();
  };
  for (const Piece& p : pieces) {
    if (p.content) {
      run += p.text;
      continue;
    }
    for (Part& part : split_specials(p.text, tok, specials)) {
      if (part.token < 0) {
        run += part.text;
      } else {
        flush();
        out.push_back(part.token);
      }
    }
  }
  flush();
  return out;
}

namespace {

// The template parsed, and rendered once for a one-message conversation (a template that uses
// what the engine lacks fails here, at start-up, rather than on every request, and one that
// leaves the message out is no chat template); null and the reason otherwise. A
// raise_exception() for that conversation is the template's choice.
std::shared_ptr<const jinja::Template> try_jinja(const ChatTemplate& base, const std::string& text, std::string& error) {
  try {
    auto tmpl = std::make_shared<const jinja::Template>(jinja::Template::parse(text));
    ChatTemplate probe = base;
    probe.jinja = tmpl;
    try {
      if (probe.apply({{"user", "Hello"}}).find("Hello") == std::string::npos)
        throw jinja::TemplateError(0, 0, "it leaves the message out of a one-message conversation");
    } catch (const ApiError& e) {
      if (e.status() != 400) throw jinja::TemplateError(0, 0, e.what());
    }
    return tmpl;
  } catch (const jinja::TemplateError& e) {
    error = e.line() > 0 ? e.what() : e.message();
    return nullptr;
  }
}

// Whether the Jinja shows tools: rendered with a probe tool, its name must appear.
bool jinja_renders_tools(const ChatTemplate& t) {
  ChatTemplate probe = t;
  probe.jinja_tools = true;
  ToolDef tool;
  tool.name = "tern_probe_tool_q7x";
  tool.description = "probe";
  tool.parameters = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
  try {
    return probe.apply({{"user", "Hello"}}, {tool}).find(tool.name) != std::string::npos;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

ChatTemplate select_chat_template(const std::string& override_spec, const std::string& gguf_template,
                                  const std::string& bos_text, const std::string& eos_text, std::string* note) {
  ChatTemplate t;
  t.bos_text = bos_text;
  t.eos_text = eos_text;
  std::string why, jinja_text;
  if (!override_spec.empty()) {
    if (auto f = chat_family_from_name(override_spec)) {
      t.family = *f;
      why = "--chat-template " + override_spec;
    } else {
      if (!std::filesystem::is_regular_file(override_spec))
        fail("--chat-template ", override_spec,
             ": neither a template name (chatml, llama2, llama3, mistral, phi3, zephyr, gemma) nor a file");
      std::ifstream in(override_spec, std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      if (!in && !in.eof()) fail("--chat-template ", override_spec, ": cannot read the file");
      std::string error;
      jinja_text = ss.str();
      t.jinja = try_jinja(t, jinja_text, error);
      if (!t.jinja) fail("--chat-template ", override_spec, ": ", error);
      t.family = detect_chat_template(ss.str()).value_or(ChatFamily::ChatML);
      why = "Jinja from " + override_spec;
    }
  } else if (gguf_template.empty()) {
    t.family = ChatFamily::ChatML;
    t.declared = false;
    why = "the model has no tokenizer.chat_template: default";
  } else {
    std::string error;
    jinja_text = gguf_template;
    t.jinja = try_jinja(t, gguf_template, error);
    if (t.jinja) {
      t.family = detect_chat_template(gguf_template).value_or(ChatFamily::ChatML);
      why = "the model's tokenizer.chat_template";
    } else if (auto f = detect_chat_template(gguf_template)) {
      t.family = *f;
      why = "the model's tokenizer.chat_template cannot be used (" + error + "); built-in, detected by its markers";
    } else {
      t.family = ChatFamily::ChatML;
      why = "the model's tokenizer.chat_template cannot be used (" + error + ") and matches no known family: default";
    }
  }
  if (t.jinja) t.jinja_tools = jinja_renders_tools(t);
  t.tool_format = t.jinja_tools ? detect_tool_format(jinja_text) : ToolFormat::Generic;
  if (note)
    *note = str_cat("chat template: ", t.name(), " (", why, "); tool calls: ", tool_format_name(t.tool_format),
                    t.jinja_tools ? "" : " (tools described in the system message)");
  return t;
}

}  // namespace tern::server
