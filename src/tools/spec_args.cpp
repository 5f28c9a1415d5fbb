#include "tools/spec_args.h"

#include "compress/quantize.h"
#include "core/error.h"
#include "core/read_file.h"
#include "models/model.h"

namespace tern {

void resolve_self_draft(SpecConfig& spec, const std::shared_ptr<const GgufFile>& target, int n_threads) {
  if (spec.self_draft.empty() || spec.draft_file) return;
  QuantizeOptions q;
  q.type = parse_quantize_type(spec.self_draft);
  q.allow_requantize = true;  // a draft only guesses: the target's verification keeps the output exact
  q.n_threads = n_threads;
  auto image = std::make_shared<std::vector<uint8_t>>(quantize_model_image(*target, q));
  spec.draft_file = std::make_shared<const GgufFile>(
      GgufFile::parse(image, image->data(), image->size(), str_cat(target->path(), " requantized to ", spec.self_draft)));
}

// Only GGUF: the draft's vocabulary is compared with the target's key by key (check_draft_vocab),
// and a llama2.c checkpoint would need a tokenizer.bin of its own to become one; `tern convert`
// makes the GGUF once.
std::shared_ptr<const GgufFile> open_draft_file(const std::string& path) {
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  if (bin && !has_gguf_magic(path))
    fail("--draft ", path, ": a llama2.c .bin checkpoint cannot be a draft model; convert it to GGUF first "
         "(tern convert MODEL.bin --tokenizer TOKENIZER.bin -o DRAFT.gguf)");
  try {
    return std::make_shared<const GgufFile>(GgufFile::open(path));
  } catch (const Error& e) {
    fail("--draft: ", e.what());
  }
}

void add_spec_options(CLI::App& app, SpecArgs& args) {
  app.add_option("--lookup", args.lookup,
                 "speculative decoding by prompt lookup: draft what followed the last N tokens earlier in the "
                 "prompt and output (N in [1, 16]; 0: off)")
      ->capture_default_str();
  app.add_option("--draft", args.draft,
                 "speculative decoding with a draft model: a smaller GGUF with this model's vocabulary");
  app.add_option("--draft-self", args.draft_self,
                 "self-speculation: the model's own weights requantized in memory to TYPE (e.g. q4_0) draft for it");
  app.add_option("--draft-max", args.draft_max, "most tokens drafted per step (1..32)")->capture_default_str();
  app.add_option("--draft-min", args.draft_min, "fewest tokens the adaptive draft length goes down to (0: it may stop drafting where drafts do not pay)")
      ->capture_default_str();
  app.add_flag("--draft-fixed", args.draft_fixed, "always draft --draft-max tokens (no adaptive length)");
}

SpecConfig spec_config_from_args(const SpecArgs& args) {
  SpecConfig c;
  if (int(args.lookup != 0) + int(!args.draft.empty()) + int(!args.draft_self.empty()) > 1)
    fail("--lookup, --draft and --draft-self are three drafters: give one");
  if (args.lookup < 0 || args.lookup > 16) fail("--lookup N: the n-gram length must be in [1, 16] (0: off), got ", args.lookup);
  if (args.lookup > 0) {
    c.source = DraftSource::Lookup;
    c.ngram.ngram_max = args.lookup;
    c.ngram.ngram_min = 1;
  } else if (!args.draft_self.empty()) {
    try {
      c.self_draft = dtype_name(parse_quantize_type(args.draft_self));
    } catch (const Error& e) {
      fail("--draft-self: ", e.what());
    }
    c.source = DraftSource::DraftModel;
  } else if (!args.draft.empty()) {
    if (!path_exists(args.draft)) fail("--draft ", args.draft, ": no such file");
    c.source = DraftSource::DraftModel;
    c.draft_path = args.draft;
  }
  c.n_draft_max = args.draft_max;
  c.n_draft_min = args.draft_min;
  c.adaptive = !args.draft_fixed;
  if (c.source == DraftSource::None) {
    // A length without a drafter is harmless but probably a mistake in the command line.
    if (args.draft_max != 8 || args.draft_min != 0 || args.draft_fixed)
      fail("--draft-max / --draft-min / --draft-fixed need --lookup N, --draft FILE or --draft-self TYPE");
    return c;
  }
  c.validate();
  return c;
}

}  // namespace tern
