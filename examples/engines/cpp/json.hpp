// A tiny JSON reader and writer: enough for the engine protocol's lines, config.json and a
// safetensors header, and strict where it matters to the gate. Integers are kept exact
// (token ids never pass through a double); invalid UTF-8, trailing text and nesting deeper
// than 64 are refused; a non-finite number cannot be written (JSON has none: the protocol
// says to omit a -Infinity pair, never to write NaN).
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace json {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // keeps the order keys were written in

struct Value {
  enum class Kind { Null, Bool, Int, Real, String, Array, Object };
  Kind kind = Kind::Null;
  bool b = false;
  long long i = 0;
  double d = 0;
  std::string s;
  json::Array a;
  json::Object o;

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool v) : kind(Kind::Bool), b(v) {}
  Value(int v) : kind(Kind::Int), i(v) {}
  Value(long long v) : kind(Kind::Int), i(v) {}
  Value(double v) : kind(Kind::Real), d(v) {}
  Value(const char* v) : kind(Kind::String), s(v) {}
  Value(std::string v) : kind(Kind::String), s(std::move(v)) {}
  Value(json::Array v) : kind(Kind::Array), a(std::move(v)) {}
  Value(json::Object v) : kind(Kind::Object), o(std::move(v)) {}

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Real; }
  double number() const { return kind == Kind::Int ? static_cast<double>(i) : d; }
  // The value under `key` of an object, or nullptr (also when this is not an object).
  const Value* find(const std::string& key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& kv : o)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
};

namespace detail {

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}

  Value document() {
    Value v = value(0);
    ws();
    if (p_ != t_.size()) fail("trailing characters after the value");
    return v;
  }

 private:
  const std::string& t_;
  size_t p_ = 0;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(why + " at character " + std::to_string(p_ + 1));
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (t_.compare(p_, n, word) != 0) return false;
    p_ += n;
    return true;
  }

  Value value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    ws();
    if (p_ >= t_.size()) fail("unexpected end of input");
    char c = t_[p_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value(string());
    if (literal("true")) return Value(true);
    if (literal("false")) return Value(false);
    if (literal("null")) return Value();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Value object(int depth) {
    Object out;
    ++p_;
    ws();
    if (p_ < t_.size() && t_[p_] == '}') return ++p_, Value(std::move(out));
    for (;;) {
      ws();
      if (p_ >= t_.size() || t_[p_] != '"') fail("expected a string key");
      std::string key = string();
      ws();
      if (p_ >= t_.size() || t_[p_++] != ':') fail("expected ':'");
      out.emplace_back(std::move(key), value(depth + 1));
      ws();
      if (p_ < t_.size() && t_[p_] == ',') { ++p_; continue; }
      if (p_ < t_.size() && t_[p_] == '}') return ++p_, Value(std::move(out));
      fail("expected ',' or '}'");
    }
  }

  Value array(int depth) {
    Array out;
    ++p_;
    ws();
    if (p_ < t_.size() && t_[p_] == ']') return ++p_, Value(std::move(out));
    for (;;) {
      out.push_back(value(depth + 1));
      ws();
      if (p_ < t_.size() && t_[p_] == ',') { ++p_; continue; }
      if (p_ < t_.size() && t_[p_] == ']') return ++p_, Value(std::move(out));
      fail("expected ',' or ']'");
    }
  }

  Value number() {
    size_t start = p_;
    bool integral = true;
    if (t_[p_] == '-') ++p_;
    if (p_ < t_.size() && t_[p_] == '0') ++p_;
    else if (!digits()) fail("bad number");
    if (p_ < t_.size() && t_[p_] == '.') { ++p_; integral = false; if (!digits()) fail("bad number"); }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      ++p_; integral = false;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      if (!digits()) fail("bad number");
    }
    const std::string text = t_.substr(start, p_ - start);
    if (integral) {  // exact, unless it does not fit 64 bits (then it is read as a double)
      errno = 0;
      long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno != ERANGE) return Value(v);
    }
    return Value(std::strtod(text.c_str(), nullptr));
  }
  bool digits() {
    size_t s = p_;
    while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    return p_ > s;
  }

  unsigned hex4() {
    if (p_ + 4 > t_.size()) fail("bad \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = t_[p_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else fail("bad \\u escape");
    }
    return v;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) { out += char(cp); return; }
    if (cp < 0x800) { out += char(0xC0 | cp >> 6); }
    else if (cp < 0x10000) { out += char(0xE0 | cp >> 12); out += char(0x80 | (cp >> 6 & 0x3F)); }
    else { out += char(0xF0 | cp >> 18); out += char(0x80 | (cp >> 12 & 0x3F)); out += char(0x80 | (cp >> 6 & 0x3F)); }
    out += char(0x80 | (cp & 0x3F));
  }
  // One UTF-8 sequence starting at p_, checked (no overlong forms, no surrogates), copied to out.
  void raw_utf8(std::string& out) {
    unsigned char c = t_[p_];
    int n = c >= 0xC2 && c < 0xE0 ? 1 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0 || p_ + n >= t_.size()) fail("invalid UTF-8");
    unsigned cp = c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
      unsigned char x = t_[p_ + k];
      if ((x & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = cp << 6 | (x & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
      fail("invalid UTF-8");
    out.append(t_, p_, n + 1);
    p_ += n + 1;
  }

  std::string string() {
    std::string out;
    ++p_;  // the opening quote
    for (;;) {
      if (p_ >= t_.size()) fail("unterminated string");
      unsigned char c = t_[p_];
      if (c == '"') { ++p_; return out; }
      if (c < 0x20) fail("control character in a string");
      if (c >= 0x80) { raw_utf8(out); continue; }
      ++p_;
      if (c != '\\') { out += char(c); continue; }
      if (p_ >= t_.size()) fail("unterminated string");
      char e = t_[p_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp < 0xE000) fail("lone low surrogate");
          if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate: a low one must follow
            if (!literal("\\u")) fail("lone high surrogate");
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("lone high surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

inline void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) { char buf[8]; std::snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
    else out += char(c);  // UTF-8 passes through (a parsed string was checked on the way in)
  }
  out += '"';
}

inline void dump(std::string& out, const Value& v) {
  char buf[32];
  switch (v.kind) {
    case Value::Kind::Null: out += "null"; break;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.i); break;
    case Value::Kind::Real:
      if (!std::isfinite(v.d)) throw Error("a non-finite number cannot be written as JSON");
      std::snprintf(buf, sizeof buf, "%.17g", v.d);  // 17 digits: a double round-trips
      out += buf;
      break;
    case Value::Kind::String: dump_string(out, v.s); break;
    case Value::Kind::Array:
      out += '[';
      for (size_t k = 0; k < v.a.size(); ++k) { if (k) out += ','; dump(out, v.a[k]); }
      out += ']';
      break;
    case Value::Kind::Object:
      out += '{';
      for (size_t k = 0; k < v.o.size(); ++k) {
        if (k) out += ',';
        dump_string(out, v.o[k].first);
        out += ':';
        dump(out, v.o[k].second);
      }
      out += '}';
      break;
  }
}

}  // namespace detail

inline Value parse(const std::string& text) { return detail::Parser(text).document(); }

inline std::string dump(const Value& v) {
  std::string out;
  detail::dump(out, v);
  return out;
}

}  // namespace json
