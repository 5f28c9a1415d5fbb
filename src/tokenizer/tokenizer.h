#pragma once
// Tokenizers built from GGUF metadata (tokenizer.ggml.*) or a llama2.c tokenizer.bin.
//   - "llama": SentencePiece-style BPE over scores, with byte fallback <0xNN>, '▁' for spaces
//   - "gpt2":  byte-level BPE with merges and the pre-tokenizer regex tokenizer.ggml.pre names
//              (GPT-2's, starcoder/refact's digit split, Llama 3's, Qwen2's)
// Both reproduce llama.cpp's tokenizer test vectors exactly (tests/tokenizer).
// Immutable after construction; all methods are thread-safe.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace tern {

// llama.cpp's token attribute ids (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Throws tern::Error when the file has no (or a malformed / unsupported) tokenizer.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);

  // Token ids of `text`. add_bos prepends BOS. parse_special: when true, control/user-defined
  // token texts appearing in `text` (e.g. "<|im_start|>") become those tokens; when false
  // they are tokenized as plain text (llama.cpp test vectors use false).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                      bool parse_special = false) const = 0;

  // Raw bytes this token contributes to the output text: byte tokens give their byte, '▁'
  // becomes ' ' (SPM), byte-level BPE pieces are mapped back to bytes; control tokens give ""
  // unless render_special. May be an incomplete UTF-8 sequence (see StreamDecoder).
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  // Whole-text decode of ids (SPM: drops the leading space after BOS as llama.cpp does).
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }  // -1 when none
  bool add_bos_default() const { return add_bos_; }
  bool add_eos_default() const { return add_eos_; }
  // End of generation: EOS, EOT, or another token marked as such.
  bool is_eog(int32_t id) const;
  const std::string& model_kind() const { return model_; }  // "llama" or "gpt2"

  // Vocabulary as stored (GGUF spelling), for writers and inspection.
  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<float>& scores() const { return scores_; }
  const std::vector<int32_t>& token_types() const { return types_; }
  const std::vector<std::string>& merges() const { return merges_; }

 protected:
  std::string model_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::vector<std::string> merges_;
  int32_t bos_id_ = 1, eos_id_ = 2, eot_id_ = -1, unk_id_ = 0;
  bool add_bos_ = true, add_eos_ = false;
  std::vector<int32_t> eog_ids_;
  // SPM: a space was prepended to the text when encoding (tokenizer.ggml.add_space_prefix),
  // so decoding drops it again after BOS.
  bool add_space_prefix_ = false;

 private:
  friend class StreamDecoder;
};

// Turns a stream of token ids into text that is always valid UTF-8: bytes of a character
// split across tokens are held back until it is complete. Not thread-safe (one per stream).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Text completed by this token (possibly empty). `first` handling: the SPM leading space
  // after BOS is dropped for the first piece, as llama.cpp does.
  std::string push(int32_t id);
  // Whatever is still held at the end (invalid bytes become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool at_start_ = true;   // no text emitted yet
  bool after_bos_ = false;  // BOS was pushed while at_start_
};

}  // namespace tern
