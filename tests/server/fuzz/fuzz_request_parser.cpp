// libFuzzer harness for the OpenAI request parser (coverage-guided; the gtest
// FuzzParser.* tests are the deterministic, always-run counterpart). Built and run by
// run_fuzz.sh. Contract: any input either parses or raises ApiError(400); nothing else
// escapes, and ASan/UBSan see no error.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"
#include "server/chat_template.h"
#include "server/openai_request.h"

using namespace tern::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // First byte picks the endpoint, so one corpus covers both.
  const ApiKind kind = data[0] & 1 ? ApiKind::Chat : ApiKind::Completion;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const OpenAiRequest r = parse_openai_request(body, kind);
    r.sampling.validate();
    if (kind == ApiKind::Chat) {
      for (ChatFamily f : {ChatFamily::ChatML, ChatFamily::Llama2, ChatFamily::Gemma}) {
        ChatTemplate t;
        t.family = f;
        try {
          (void)t.apply(r.messages);
        } catch (const ApiError& e) {
          if (e.status() != 400) std::abort();
        }
      }
    }
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
  }
  try {
    (void)parse_tokenize_request(body);
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
  }
  return 0;
}
