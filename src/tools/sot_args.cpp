#include "tools/sot_args.h"

#include <fstream>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tern {

void SotArgs::add_to(CLI::App& app, bool with_template) {
  app.add_option("--skeleton", skeleton_file,
                 "The points to expand, one per line (no skeleton stage): measures the expansion on models too "
                 "small to write a skeleton");
  if (with_template)
    app.add_option("--chat-template", chat_template,
                   "Chat template: a family name (chatml, llama2, llama3, mistral, phi3, zephyr, gemma) or a Jinja "
                   "file; default: the model's own (a model without one is refused)");
  app.add_option("--skeleton-tokens", skeleton_tokens, "Most tokens of the skeleton stage")->capture_default_str();
  app.add_option("--point-tokens", point_tokens, "Most tokens of each point's expansion")->capture_default_str();
  app.add_option("--plain-tokens", plain_tokens, "Most tokens of the plain answer when the router falls back")
      ->capture_default_str();
  app.add_option("--min-points", min_points, "A skeleton with fewer points falls back to plain decoding")
      ->capture_default_str();
  app.add_option("--max-points", max_points, "Points after this many are dropped")->capture_default_str();
}

server::SkeletonOptions SotArgs::options() const {
  const auto positive = [](const char* flag, int64_t v) {
    if (v < 1) fail(flag, " must be at least 1 (got ", v, ")");
  };
  positive("--skeleton-tokens", skeleton_tokens);
  positive("--point-tokens", point_tokens);
  positive("--plain-tokens", plain_tokens);
  positive("--min-points", min_points);
  if (max_points < min_points) fail("--max-points (", max_points, ") must be at least --min-points (", min_points, ")");
  server::SkeletonOptions o;
  o.skeleton_max_tokens = skeleton_tokens;
  o.point_max_tokens = point_tokens;
  o.plain_max_tokens = plain_tokens;
  o.min_points = min_points;
  o.max_points = max_points;
  if (!skeleton_file.empty()) {
    o.points = read_skeleton_file(skeleton_file);
    if (int(o.points.size()) > max_points)
      fail("--skeleton ", skeleton_file, ": ", o.points.size(), " points, over --max-points (", max_points, ")");
  }
  return o;
}

std::vector<std::string> read_skeleton_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--skeleton ", path, ": cannot open the file");
  std::vector<std::string> points;
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos) continue;
    size_t b = line.find_last_not_of(" \t\r");
    std::string_view s(line.data() + a, b - a + 1);
    // "3. text", "3) text", "- text": the text.
    size_t d = 0;
    while (d < s.size() && d < 4 && std::isdigit(static_cast<unsigned char>(s[d]))) ++d;
    if (d > 0 && d < s.size() && (s[d] == '.' || s[d] == ')')) s.remove_prefix(d + 1);
    else if (s.substr(0, 2) == "- " || s.substr(0, 2) == "* ") s.remove_prefix(2);
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    if (s.empty()) continue;
    points.emplace_back(s);
  }
  if (in.bad()) fail("--skeleton ", path, ": cannot read the file");
  if (points.empty()) fail("--skeleton ", path, ": no point in the file (one per line)");
  return points;
}

server::ChatTemplate sot_chat_template(const std::string& override_spec, const GgufFile& file, const Tokenizer& tok) {
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < tok.n_vocab() ? tok.tokens()[size_t(id)] : std::string();
  };
  return server::select_chat_template(override_spec, file.get_string("tokenizer.chat_template", ""),
                                      token_text(tok.bos_id()), token_text(tok.eos_id()));
}

}  // namespace tern
