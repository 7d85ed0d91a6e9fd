#pragma once
// The "text" field of one JSON Lines line (corpus.hpp reads JSON Lines corpora). A small strict
// validator of RFC 8259 JSON rather than a general parser: the corpus reader needs a yes/no per
// line, a message that says where a bad line goes wrong, and the decoded text of one top-level
// string member; every other value is checked and thrown away.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "olmax/core/error.hpp"

namespace olmax::data::detail {

/// What one line gave: `ok` with `text` decoded to UTF-8, or `problem` (with a 1-based column).
struct JsonTextField {
    enum class Status { ok, no_text_field, text_not_string, invalid };
    Status status = Status::invalid;
    std::string text;
    std::string problem;
};

class JsonLineParser {
public:
    /// Deeper nesting is rejected instead of recursing further: a line of a million "[" must
    /// give a message, not a stack overflow.
    static constexpr std::size_t max_depth = 512;

    explicit JsonLineParser(std::string_view line) : s_(line) {}

    JsonTextField parse() {
        JsonTextField result;
        skip_whitespace();
        if (!at('{')) return fail(result, "expected a JSON object ('{')");
        bool found = false, is_string = false;
        if (!parse_object(0, &found, &is_string, &result.text)) return fail(result, error_);
        skip_whitespace();
        if (pos_ != s_.size()) return fail(result, "unexpected characters after the JSON object");
        if (!found) {
            result.status = JsonTextField::Status::no_text_field;
            result.problem = "no \"text\" field";
        } else if (!is_string) {
            result.status = JsonTextField::Status::text_not_string;
            result.problem = "\"text\" is not a string";
            result.text.clear();
        } else {
            result.status = JsonTextField::Status::ok;
        }
        return result;
    }

private:
    std::string_view s_;
    std::size_t pos_ = 0;
    std::string error_;

    JsonTextField& fail(JsonTextField& result, std::string_view why) {
        result.status = JsonTextField::Status::invalid;
        result.text.clear();
        result.problem = olmax::detail::concat(why, " at column ", pos_ + 1);
        return result;
    }

    bool error(std::string_view why) {
        if (error_.empty()) error_ = std::string(why);
        return false;
    }

    bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

    void skip_whitespace() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
    }

    /// Top-level call (depth 0) records the last member named "text" (later duplicates win, as in
    /// JavaScript's JSON.parse); nested objects are only validated.
    bool parse_object(std::size_t depth, bool* found, bool* is_string, std::string* text) {
        if (depth >= max_depth) return error("nested too deeply");
        ++pos_;  // '{'
        skip_whitespace();
        if (at('}')) {
            ++pos_;
            return true;
        }
        std::string key;
        while (true) {
            skip_whitespace();
            if (!at('"')) return error("expected a member name in double quotes");
            key.clear();
            if (!parse_string(&key)) return false;
            skip_whitespace();
            if (!at(':')) return error("expected ':' after a member name");
            ++pos_;
            skip_whitespace();
            if (depth == 0 && key == "text") {
                *found = true;
                *is_string = at('"');
                text->clear();
                if (!(*is_string ? parse_string(text) : parse_value(depth + 1))) return false;
            } else if (!parse_value(depth + 1)) {
                return false;
            }
            skip_whitespace();
            if (at(',')) {
                ++pos_;
                continue;
            }
            if (at('}')) {
                ++pos_;
                return true;
            }
            return error("expected ',' or '}' in an object");
        }
    }

    bool parse_array(std::size_t depth) {
        if (depth >= max_depth) return error("nested too deeply");
        ++pos_;  // '['
        skip_whitespace();
        if (at(']')) {
            ++pos_;
            return true;
        }
        while (true) {
            skip_whitespace();
            if (!parse_value(depth + 1)) return false;
            skip_whitespace();
            if (at(',')) {
                ++pos_;
                continue;
            }
            if (at(']')) {
                ++pos_;
                return true;
            }
            return error("expected ',' or ']' in an array");
        }
    }

    bool parse_value(std::size_t depth) {
        if (pos_ >= s_.size()) return error("unexpected end of line, expected a value");
        const char c = s_[pos_];
        if (c == '{') {
            bool found = false, is_string = false;
            std::string ignored;
            return parse_object(depth, &found, &is_string, &ignored);
        }
        if (c == '[') return parse_array(depth);
        if (c == '"') return parse_string(nullptr);
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        for (const std::string_view literal : {std::string_view("true"), std::string_view("false"), std::string_view("null")}) {
            if (s_.substr(pos_).starts_with(literal)) {
                pos_ += literal.size();
                return true;
            }
        }
        return error("expected a value");
    }

    bool digits() {
        const std::size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        return pos_ > start;
    }

    /// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    bool parse_number() {
        if (at('-')) ++pos_;
        if (at('0')) {
            ++pos_;
        } else if (!digits()) {
            return error("expected a digit");
        }
        if (at('.')) {
            ++pos_;
            if (!digits()) return error("expected a digit after '.'");
        }
        if (at('e') || at('E')) {
            ++pos_;
            if (at('+') || at('-')) ++pos_;
            if (!digits()) return error("expected a digit in the exponent");
        }
        return true;
    }

    static int hex_value(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    /// Reads the 4 hex digits after "\u" (pos_ is on the first digit).
    bool hex4(std::uint32_t& out) {
        if (s_.size() - pos_ < 4) return error("expected 4 hex digits after \\u");
        out = 0;
        for (int i = 0; i < 4; ++i) {
            const int v = hex_value(s_[pos_]);
            if (v < 0) return error("expected 4 hex digits after \\u");
            out = out * 16 + std::uint32_t(v);
            ++pos_;
        }
        return true;
    }

    static void append_utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        } else {
            out += char(0xF0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        }
    }

    /// A string literal (pos_ on the opening quote), decoded into `out` unless it is null.
    /// \uD83D\uDE00 pairs become one 4-byte UTF-8 character; an unpaired surrogate cannot be
    /// written as UTF-8 and becomes U+FFFD (what Go's encoding/json does) rather than costing the
    /// whole line. Raw bytes >= 0x80 pass through unchanged: the model reads bytes.
    bool parse_string(std::string* out) {
        ++pos_;  // '"'
        while (true) {
            if (pos_ >= s_.size()) return error("unterminated string");
            const char c = s_[pos_];
            if (c == '"') {
                ++pos_;
                return true;
            }
            if (static_cast<unsigned char>(c) < 0x20) return error("control character in a string (must be escaped)");
            if (c != '\\') {
                if (out) *out += c;
                ++pos_;
                continue;
            }
            ++pos_;
            if (pos_ >= s_.size()) return error("unterminated string");
            const char e = s_[pos_++];
            char plain = 0;
            switch (e) {
                case '"': plain = '"'; break;
                case '\\': plain = '\\'; break;
                case '/': plain = '/'; break;
                case 'b': plain = '\b'; break;
                case 'f': plain = '\f'; break;
                case 'n': plain = '\n'; break;
                case 'r': plain = '\r'; break;
                case 't': plain = '\t'; break;
                case 'u': {
                    std::uint32_t cp = 0;
                    if (!hex4(cp)) return false;
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        // A high surrogate: only a following \u low surrogate completes it.
                        std::uint32_t low = 0;
                        if (s_.substr(pos_).starts_with("\\u")) {
                            const std::size_t saved = pos_;
                            pos_ += 2;
                            if (!hex4(low)) return false;
                            if (low >= 0xDC00 && low <= 0xDFFF) {
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                            } else {
                                pos_ = saved;  // the next escape is read on its own
                                cp = 0xFFFD;
                            }
                        } else {
                            cp = 0xFFFD;
                        }
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        cp = 0xFFFD;
                    }
                    if (out) append_utf8(*out, cp);
                    continue;
                }
                default:
                    --pos_;
                    return error("invalid escape in a string");
            }
            if (out) *out += plain;
        }
    }
};

/// The decoded top-level "text" string of one JSON Lines line.
inline JsonTextField json_text_field(std::string_view line) { return JsonLineParser(line).parse(); }

}  // namespace olmax::data::detail
