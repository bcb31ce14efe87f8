// corpus.h — text to token streams, per ../shared/assets/README.md: the whole file as one string,
// encoded, with one BOS in front. `.jsonl` files: the `text` fields joined by "\n\n".
#pragma once
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace ptq {

std::string read_corpus(const std::string& path);
bool is_jsonl(const std::string& path);
std::vector<std::string> read_jsonl_texts(const std::string& path);   // the `text` of every record    // Errc::input if empty; jsonl records must have "text"
std::vector<int32_t> encode_corpus(const Tokenizer& tok, const std::string& path);
// Non-overlapping windows of L tokens from the start; the remainder is dropped.
int64_t count_windows(size_t n_tokens, int L);

}  // namespace ptq
