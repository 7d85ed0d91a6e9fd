#pragma once
// Byte-level tokenizer: every byte is its own token (vocab 256), as in the original's
// "the-char-pile" setting. Documents are separated by an end-of-document byte; the original used
// byte 4 (ASCII EOT, its data pipeline's document separator), which ordinary text does not contain.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace olmax::data {

struct ByteTokenizer {
    static constexpr std::size_t vocab_size = 256;
    static constexpr std::uint8_t end_of_document = 4;

    /// Bytes of `text` as tokens. A stray end-of-document byte inside the text is dropped so it
    /// cannot forge a document boundary.
    static std::vector<std::uint8_t> encode(std::string_view text) {
        std::vector<std::uint8_t> out;
        out.reserve(text.size());
        for (char c : text)
            if (static_cast<std::uint8_t>(c) != end_of_document) out.push_back(static_cast<std::uint8_t>(c));
        return out;
    }

    /// Tokens back to bytes; the end-of-document token becomes `separator`.
    template <class Int>
    static std::string decode(const std::vector<Int>& tokens, std::string_view separator = "\n\n") {
        std::string out;
        out.reserve(tokens.size());
        for (Int t : tokens) {
            if (static_cast<std::uint8_t>(t) == end_of_document) out += separator;
            else out.push_back(static_cast<char>(static_cast<std::uint8_t>(t)));
        }
        return out;
    }
};

}  // namespace olmax::data
