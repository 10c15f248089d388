// Greedy speculative decoding by prompt lookup (n-gram drafting), lossless by construction:
// draft up to K tokens by finding the sequence's last n-gram earlier in the sequence and copying
// what followed it, run the last token and the draft through ONE forward over K+1 positions,
// accept the longest prefix of the draft that equals the verifier's own argmax at each
// position, then emit the verifier's token after it (the correction, or a bonus when all K
// agree). The KV cache keeps the last token and the accepted drafts only: positions written for
// rejected drafts are rolled back (the next forward starts right after the accepted ones and
// overwrites them).
//
// Why it is exact here: the verify forward computes each of its rows with the decode path's
// arithmetic (dot_sequential, one row at a time per matmul, attention over the cache up to that
// row), so row j's logits are bit for bit what decoding those tokens one by one would give.
//
// STRICT_GATE_CPP_SPEC_BUG (tests only) plants one of the classic bugs, to prove the gate's
// speculative variant catches each: accept-mismatch (the first disagreeing draft is accepted too),
// off-by-one (draft j is checked against the row after the one that predicts it), no-rollback
// (the cache keeps the rejected drafts' positions after a rejection).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace spec {

enum class Bug { None, AcceptMismatch, OffByOne, NoRollback };

inline Bug bug_named(const std::string& name) {
  if (name.empty()) return Bug::None;
  if (name == "accept-mismatch") return Bug::AcceptMismatch;
  if (name == "off-by-one") return Bug::OffByOne;
  if (name == "no-rollback") return Bug::NoRollback;
  throw std::runtime_error("STRICT_GATE_CPP_SPEC_BUG=" + name + ": not accept-mismatch, off-by-one or no-rollback");
}

struct Request {
  int k = 0;  // num_speculative_tokens; 0: no speculation asked
  int lookup_max = 3, lookup_min = 1;
};

// A generate request's "speculative" object: {"method": "ngram", "num_speculative_tokens": K,
// optional "prompt_lookup_max", "prompt_lookup_min"}. Absent or null: no speculation.
inline Request read_request(const json::Value& req) {
  using Kind = json::Value::Kind;
  Request r;
  const json::Value* s = req.find("speculative");
  if (!s || s->is(Kind::Null)) return r;
  if (!s->is(Kind::Object)) throw std::runtime_error("\"speculative\" must be an object");
  const json::Value* method = s->find("method");
  if (!method || !method->is(Kind::String) || method->s != "ngram")
    throw std::runtime_error("\"speculative\".\"method\" must be \"ngram\" (this engine drafts by prompt lookup only)");
  auto integer = [&](const char* key, int fallback, bool required) {
    const json::Value* v = s->find(key);
    if (!v && !required) return fallback;
    if (!v || !v->is(Kind::Int) || v->i < 1 || v->i > 64)
      throw std::runtime_error(std::string("\"speculative\".\"") + key + "\" must be an integer from 1 to 64");
    return int(v->i);
  };
  r.k = integer("num_speculative_tokens", 0, true);
  r.lookup_max = integer("prompt_lookup_max", 3, false);
  r.lookup_min = integer("prompt_lookup_min", 1, false);
  if (r.lookup_min > r.lookup_max) throw std::runtime_error("\"speculative\": prompt_lookup_min > prompt_lookup_max");
  return r;
}

// Up to k tokens: what followed the most recent earlier occurrence of the sequence's last n
// tokens, the longest n (lookup_max down to lookup_min) that has one.
inline std::vector<int> ngram_draft(const std::vector<int>& seq, const Request& r, int k) {
  const int len = int(seq.size());
  for (int n = std::min(r.lookup_max, len - 1); n >= r.lookup_min && k > 0; --n) {
    for (int i = len - n - 1; i >= 0; --i) {
      if (!std::equal(seq.end() - n, seq.end(), seq.begin() + i)) continue;
      const int from = i + n, to = std::min(from + k, len);
      if (from < to) return std::vector<int>(seq.begin() + from, seq.begin() + to);
    }
  }
  return {};
}

struct Stats {
  long long drafted = 0, accepted = 0, drafts = 0;
};

// The decode loop after the prefill's first token. seq: the prompt and the tokens emitted so far
// (the last one not yet in the cache); cached: positions in the KV cache. forward(toks, start)
// runs toks at positions start.. and returns one row of logits per token; greedy(row) is the
// row's argmax; emit(row, forced) emits the row's greedy token (forced < 0) or `forced` with
// the row's logprobs, and returns the token; left() is how many tokens may still be emitted
// (0 once an EOS was emitted).
inline Stats decode(std::vector<int> seq, int cached, const Request& r, Bug bug, int vocab,
                    const std::function<std::vector<float>(const std::vector<int>&, int)>& forward,
                    const std::function<int(const float*)>& greedy,
                    const std::function<int(const float*, int)>& emit, const std::function<int()>& left) {
  Stats st;
  while (left() > 0) {
    const std::vector<int> draft = ngram_draft(seq, r, std::min(r.k, left() - 1));
    std::vector<int> feed{seq.back()};
    feed.insert(feed.end(), draft.begin(), draft.end());
    const std::vector<float> rows = forward(feed, cached);  // row j: the token after feed[j]
    const int nrows = int(feed.size());
    auto row = [&](int j) {
      if (bug == Bug::OffByOne && j + 1 < nrows) ++j;  // planted: the row after the one that predicts it
      return &rows[size_t(j) * vocab];
    };
    st.drafted += long(draft.size());
    st.drafts += draft.empty() ? 0 : 1;
    int m = 0;  // drafts taken into the sequence
    for (; m < int(draft.size()) && left() > 0; ++m) {
      const float* lr = row(m);
      if (greedy(lr) != draft[m]) {
        if (bug == Bug::AcceptMismatch) seq.push_back(emit(lr, draft[m])), ++m, ++st.accepted;  // planted
        break;
      }
      seq.push_back(emit(lr, -1));
      ++st.accepted;
    }
    if (left() > 0) seq.push_back(emit(row(m), -1));  // the verifier's token after the accepted drafts
    // Roll back: the cache keeps feed[0..m] (the last token and the m drafts taken); the rows of
    // rejected drafts are overwritten by the next forward. Planted: keep them all.
    cached += bug == Bug::NoRollback ? nrows : m + 1;
  }
  return st;
}

}  // namespace spec
