// libFuzzer target: the Jinja engine (src/jinja) on arbitrary template text, parsed and rendered
// with a chat-like conversation and small limits. A template comes with the model file, so any
// bytes must end in a TemplateError (or a rendering), never a crash, a hang or unbounded memory.
// Built and run by run_fuzz.sh SECONDS jinja.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern::jinja;
  static const Value vars = from_json(nlohmann::ordered_json::parse(
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi <|im_end|>"},)"
      R"({"role":"assistant","content":"hello"}],"add_generation_prompt":true,"bos_token":"<s>","eos_token":"</s>"})"),
                                      true);
  Limits limits;
  limits.max_steps = 200000;
  limits.max_output = 1 << 16;
  limits.max_items = 10000;
  limits.max_depth = 64;
  try {
    const Template t = Template::parse(std::string_view(reinterpret_cast<const char*>(data), size), limits);
    RenderOptions opt;
    opt.limits = limits;
    opt.now = 0;
    (void)t.render(vars.obj(), opt);
  } catch (const TemplateError&) {
  } catch (const tern::Error&) {
  }
  return 0;
}
