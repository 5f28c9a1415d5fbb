#pragma once
// The models a multi-model server can serve (`tern serve --models DIR`, several `-m NAME=FILE`)
// and what `tern list` prints: one entry per GGUF file, named by its file, with what its header
// says (architecture, weight type, context, parameters) or why it cannot be used, and the
// per-model defaults of an optional DIR/models.json (Ollama's Modelfile idea, in JSON):
//
//   {"models": {
//      "NAME": {"file": "sub/x.gguf",            // optional: a file not named NAME.gguf
//               "aliases": ["other-name", ...],
//               "ctx": 4096, "threads": 2, "parallel": 4,
//               "chat_template": "chatml" | "path/to/template.jinja",
//               "system": "You are ...",          // system prompt when a request has none
//               "options": {"temperature": 0.7, "top_k": 40, ...},   // Ollama's option names
//               "keep_alive": "10m" | 600 | -1,
//               "adapters": ["lora.gguf", {"file": "other-lora.gguf", "scale": 0.5}]},
//      "VARIANT": {"from": "NAME",                // Ollama's FROM: served on NAME's engine
//                  "aliases": [...], "system": "...", "options": {...}, "chat_template": "...",
//                  "keep_alive": "1m", "adapters": [...]}}}
//
// "adapters" (LoRA adapters in llama.cpp's GGUF format, paths relative to DIR, scale 1 unless
// given) run with every request to that model, in order. A *variant* ("from") is another name
// for a model with a file, with defaults and adapters of its own: it runs on that model's
// engine (one load serves both, nothing held beyond its adapters), so it takes no "file",
// "ctx", "threads" or "parallel", and it does not inherit the base's system prompt, options or
// adapters (only its chat template, unless it sets one). No chains: "from" names a model with a
// file. Its entry carries the base's file facts and `parent` = the base's name.
//
// Pure file inspection (no model is loaded): reading a header touches its first pages only.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern::server {

// A LoRA adapter a model's requests run with (models.json "adapters").
struct AdapterSpec {
  std::filesystem::path path;          // resolved against the models directory
  float scale = 1.0f;                  // finite
};

// Per-model defaults from models.json; every field optional.
struct ModelDefaults {
  std::vector<std::string> aliases;
  std::optional<int64_t> ctx;
  std::optional<int> threads;
  std::optional<int64_t> parallel;
  std::string chat_template;           // "" : the model's own (as `tern serve --chat-template`)
  std::string system_prompt;           // "" : none
  nlohmann::json options = nlohmann::json::object();  // Ollama option names -> values
  std::optional<double> keep_alive_s;  // < 0: never unloaded when idle
  std::vector<AdapterSpec> adapters;   // run with every request, in order
};

struct ModelEntry {
  std::string name;                    // file stem, or NAME of -m NAME=FILE / models.json
  std::filesystem::path path;
  int64_t file_bytes = 0;
  int64_t modified_unix = 0;           // file's mtime, seconds since the epoch
  // From the GGUF header (empty / 0 when unusable):
  std::string architecture;            // general.architecture, e.g. "llama", "qwen2"
  std::string general_name;            // general.name ("" when absent)
  std::string file_type;               // weight type of most bytes, e.g. "Q4_0", "F16", "TQ4_G128"
  int64_t context_length = 0;          // ARCH.context_length (training context)
  int64_t n_params = 0;                // elements over all tensors
  std::string parameter_size;          // n_params as Ollama writes it: "260K", "494.03M", "1.1B"
  // A stable identifier of the file as listed (64 hex digits from path, size and mtime; not a
  // content hash: hashing gigabytes at start-up would cost minutes). Ollama's clients show it.
  std::string digest;
  std::string error;                   // non-empty: unusable, and why (not a GGUF, unknown architecture, ...)
  ModelDefaults defaults;
  // The model this one runs on: a LoRA adapter served as a model (`tern serve --lora`), or a
  // models.json variant ("from"), whose file facts above are its base's.
  std::string parent;

  bool usable() const { return error.empty(); }
};

// Every *.gguf file (case-insensitive suffix, not hidden) directly in DIR or one level of
// subdirectories below it, plus the files models.json names, sorted by name. A file that
// cannot be read or parsed is an entry with `error` set (never a throw). Throws tern::Error
// naming the file and key for: DIR missing or not a directory, a models.json that is not valid
// JSON or has a wrong type, a models.json "file" or adapter that does not exist, a variant
// whose "from" names no model or another variant (or that sets "file", "ctx", "threads" or
// "parallel"), and two entries (or an alias and a name) with the same name (naming both
// files). Files models.json names as adapters are adapters, not models.
std::vector<ModelEntry> scan_models_dir(const std::filesystem::path& dir);

// Entries for `-m NAME=FILE` / `-m FILE` arguments (NAME defaults to the file's stem). Same
// inspection and the same duplicate-name error as scan_models_dir; a file that does not exist
// is an error (the user named it).
std::vector<ModelEntry> models_from_args(const std::vector<std::string>& args);

// Reads the header of one file into an entry (name and defaults left to the caller).
ModelEntry inspect_model_file(const std::filesystem::path& path);

// Throws tern::Error when two entries share a name or an alias.
void check_unique_names(const std::vector<ModelEntry>& entries);

// "5m", "1h30m", "10s", "300ms", "-1", "0" (Go durations, as Ollama's keep_alive) or a JSON
// number of seconds. Negative: forever. Throws tern::Error (what = the reason) otherwise.
double parse_duration_seconds(const nlohmann::json& value);

// A parameter count as Ollama's format.HumanNumber writes it: "260K", "494.03M", "1.1B", "7B".
std::string parameter_size_text(int64_t n_params);

// `tern list` rows (plain table) and its --json form.
std::string models_table(const std::vector<ModelEntry>& entries);
nlohmann::json models_json(const std::vector<ModelEntry>& entries);

}  // namespace tern::server
