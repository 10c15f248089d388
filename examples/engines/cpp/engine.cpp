// A strict-gate engine in C++17 and nothing but the standard library: a Hugging Face Llama
// checkpoint (config.json + model.safetensors, F32) run in float32, batch 1, speaking
// strict-gate/engine@1 over stdin/stdout (docs/engine-protocol.md).
//
//   build:  bash scripts/build-cpp-engine.sh            (g++ -O2 -std=c++17 -> build/cpp/engine)
//   run:    build/cpp/engine --model strict_gate/models/tiny-llama [--prefill batched|stepwise]
//
// --prefill is the one switch, and it changes only the order in which the prompt's dot
// products are summed: `batched` (default) runs the whole prompt in one pass, every matmul
// over all positions with 8-lane blocked dot products (a GEMM's order); `stepwise` feeds the
// prompt one token at a time through the decode path (sequential dot products). Generated
// tokens always go through the decode path. Score requests take the prompt path, so under
// `batched` a score of the engine's own continuation differs from its generate logprobs in
// the last bits, and under `stepwise` it is bit for bit the same.
//
// Dump requests (strict-gate localize: activations at the canonical points, grafting, the
// decode path) are answered by dump.hpp. Where a port usually goes wrong is commented in
// llama.hpp (RoPE layout, tied head, RMSNorm eps) and below (logprobs in double, EOS ids, ties).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dump.hpp"
#include "json.hpp"
#include "llama.hpp"
#include "speculative.hpp"

namespace {

using json::Value;
using Kind = json::Value::Kind;

const char* const PROTOCOL = "strict-gate/engine@1";
const char* const VERSION = "0.1.0";

enum class Prefill { Batched, Stepwise };

FILE* proto = nullptr;  // the real stdout, kept for protocol lines only

// One protocol line, flushed. The line is complete before the first byte is written, so a
// failure to encode it (a NaN) becomes an error reply, never half a line. A failed write means
// the gate is gone (EPIPE, SIGPIPE being ignored): nobody reads any more, exit 0 quietly.
void send(const Value& v) {
  const std::string line = json::dump(v) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), proto) != line.size() || std::fflush(proto) != 0) std::_Exit(0);
}

Value error_reply(const Value& id, const std::string& why) { return json::Object{{"id", id}, {"error", why}}; }

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The ids vLLM stops on, from the model's own files, for requests without eos_token_ids:
// every id of generation_config.json's eos_token_id (an int or a list; config.json's when there
// is no generation config) plus the tokenizer's eos token. Llama 3 lists three: miss one and
// every prompt that ends on it is a length mismatch.
std::vector<long long> model_eos(const std::string& dir) {
  std::vector<long long> ids;
  for (const char* name : {"/generation_config.json", "/config.json"}) {
    if (!exists(dir + name)) continue;
    json::Value j = llama::read_json(dir + name);
    const Value* e = j.find("eos_token_id");
    json::Array listed = e && e->is(Kind::Array) ? e->a : json::Array{};
    if (e && e->is(Kind::Int)) listed.push_back(*e);
    for (const Value& v : listed)
      if (v.is(Kind::Int) && v.i >= 0) ids.push_back(v.i);
    if (!ids.empty()) break;
  }
  if (!exists(dir + "/tokenizer_config.json") || !exists(dir + "/tokenizer.json")) return ids;
  const Value tc = llama::read_json(dir + "/tokenizer_config.json");
  const Value* eos = tc.find("eos_token");
  if (eos && eos->is(Kind::Object)) eos = eos->find("content");
  if (!eos || !eos->is(Kind::String)) return ids;
  const Value tok = llama::read_json(dir + "/tokenizer.json");
  long long id = -1;
  if (const Value* added = tok.find("added_tokens"))
    for (const Value& a : added->a) {
      const Value *content = a.find("content"), *aid = a.find("id");
      if (content && content->s == eos->s && aid && aid->is(Kind::Int)) { id = aid->i; break; }
    }
  const Value* model = tok.find("model");
  const Value* vocab = model ? model->find("vocab") : nullptr;
  if (id < 0 && vocab && vocab->find(eos->s) && vocab->find(eos->s)->is(Kind::Int)) id = vocab->find(eos->s)->i;
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

// -- reading a request: anything malformed is this request's error reply, never a crash
std::vector<int> token_ids(const Value& req, const char* key, int vocab) {
  const Value* v = req.find(key);
  if (!v || !v->is(Kind::Array)) throw std::runtime_error(std::string("\"") + key + "\" must be a list of token ids");
  std::vector<int> out;
  for (const Value& t : v->a) {
    if (!t.is(Kind::Int) || t.i < 0 || t.i >= vocab)
      throw std::runtime_error(std::string("\"") + key + "\" holds " + json::dump(t) +
                               ", not a token id below the vocabulary size " + std::to_string(vocab));
    out.push_back(int(t.i));
  }
  return out;
}

long long integer(const Value& req, const char* key, long long fallback, long long min) {
  const Value* v = req.find(key);
  if (!v && fallback >= min) return fallback;
  if (!v || !v->is(Kind::Int) || v->i < min)
    throw std::runtime_error(std::string("\"") + key + "\" must be an integer >= " + std::to_string(min));
  return v->i;
}

bool flag(const Value& req, const char* key) {
  const Value* v = req.find(key);
  if (!v || v->is(Kind::Null)) return false;
  if (!v->is(Kind::Bool)) throw std::runtime_error(std::string("\"") + key + "\" must be true or false");
  return v->b;
}

// log_softmax of float32 logits, in double: logprob = logit - logsumexp(logits), the max taken
// out first so exp cannot overflow. Raw logits: no temperature, no penalties. Every value is
// <= 0 (the top one exactly so or just below), as the gate requires.
std::vector<double> log_softmax(const float* logits, int n) {
  double m = *std::max_element(logits, logits + n), s = 0.0;
  for (int t = 0; t < n; ++t) s += std::exp(double(logits[t]) - m);
  const double lse = m + std::log(s);
  std::vector<double> lp(n);
  for (int t = 0; t < n; ++t) lp[t] = double(logits[t]) - lse;
  return lp;
}

// The k best ids, logprob descending; exact ties go to the LOWEST id first, as torch.argmax and
// vLLM choose, so best(lp, 1)[0] is the greedy token.
std::vector<int> best(const std::vector<double>& lp, long long k) {
  std::vector<int> ids(lp.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t n = size_t(std::min<long long>(k, (long long)ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int a, int b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  ids.resize(n);
  return ids;
}

Value pairs(const std::vector<double>& lp, const std::vector<int>& ids) {
  json::Array out;
  for (int t : ids) out.push_back(json::Array{t, lp[t]});
  return out;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class Engine {
 public:
  Engine(llama::Model& m, Prefill mode, std::vector<long long> eos, spec::Bug bug = spec::Bug::None,
         dump::KvBug kv_bug = {})
      : m_(m), mode_(mode), eos_(std::move(eos)), bug_(bug), kv_bug_(kv_bug) {}

  Value generate(const Value& req, const Value& id) {
    if (spec::read_request(req).k > 0) return generate_speculative(req, id);  // speculative.hpp
    const int V = m_.c.vocab;
    const std::vector<int> prompt = token_ids(req, "prompt_token_ids", V);
    const long long max_tokens = integer(req, "max_tokens", -1, 1), k = integer(req, "top_logprobs", 0, 0);
    const bool stream = flag(req, "stream");
    if (prompt.empty()) throw std::runtime_error("\"prompt_token_ids\" is empty");
    fits(prompt.size() + max_tokens - 1, "prompt ids + max_tokens - 1");
    const std::set<long long> eos = request_eos(req);
    const auto t0 = std::chrono::steady_clock::now();
    double ttft = 0;
    std::vector<float> logits = prefill(prompt, int(prompt.size()) - 1);
    json::Array toks, tops;
    for (;;) {
      const std::vector<double> lp = log_softmax(logits.data(), V);
      const std::vector<int> top = best(lp, std::max<long long>(k, 1));
      const int tok = top[0];  // greedy: the argmax, the lowest id on an exact tie
      toks.push_back(tok);
      if (k > 0) tops.push_back(pairs(lp, top));
      if (toks.size() == 1) ttft = since(t0);
      if (stream) send(json::Object{{"event", "token"}, {"id", id}, {"token_id", tok}});
      if (eos.count(tok) || (long long)toks.size() == max_tokens) break;  // the EOS is part of token_ids
      logits = decode(tok, int(prompt.size() + toks.size()) - 1, int(toks.size()));
    }
    const bool stopped = eos.count(toks.back().i) > 0;
    json::Object out{{"id", id}, {"prompt_token_ids", *req.find("prompt_token_ids")}, {"token_ids", toks},
                     {"finish_reason", stopped ? "stop" : "length"}};
    if (k > 0) out.emplace_back("top_logprobs", tops);
    out.emplace_back("timing", json::Object{{"ttft_s", ttft}, {"total_s", since(t0)}});
    return out;
  }

  // Speculative decoding (a request with "speculative"): the same prefill and the same first
  // token, then speculative.hpp's draft-and-verify loop, whose verify rows are computed with the
  // decode path's arithmetic. The reply adds "speculative": {"drafted", "accepted", "drafts"}.
  Value generate_speculative(const Value& req, const Value& id) {
    const int V = m_.c.vocab;
    const spec::Request sr = spec::read_request(req);
    const std::vector<int> prompt = token_ids(req, "prompt_token_ids", V);
    const long long max_tokens = integer(req, "max_tokens", -1, 1), k = integer(req, "top_logprobs", 0, 0);
    const bool stream = flag(req, "stream");
    if (prompt.empty()) throw std::runtime_error("\"prompt_token_ids\" is empty");
    // the plain rule: a draft is never longer than the tokens still to emit minus one, so a verify
    // pass writes no position beyond the last one plain decoding would reach
    fits(prompt.size() + max_tokens - 1, "prompt ids + max_tokens - 1");
    const std::set<long long> eos = request_eos(req);
    const auto t0 = std::chrono::steady_clock::now();
    double ttft = 0;
    json::Array toks, tops;
    bool stopped = false;
    auto emit = [&](const float* row, int forced) {
      const std::vector<double> lp = log_softmax(row, V);
      std::vector<int> top = best(lp, std::max<long long>(k, 1));
      const int tok = forced >= 0 ? forced : top[0];  // greedy: the argmax, the lowest id on an exact tie
      if (std::find(top.begin(), top.end(), tok) == top.end()) top.push_back(tok);  // the chosen token is listed
      toks.push_back(tok);
      if (k > 0) tops.push_back(pairs(lp, top));
      if (toks.size() == 1) ttft = since(t0);
      if (stream) send(json::Object{{"event", "token"}, {"id", id}, {"token_id", tok}});
      stopped = stopped || eos.count(tok) > 0;
      return tok;
    };
    auto greedy = [&](const float* row) { return best(log_softmax(row, V), 1)[0]; };
    auto forward = [&](const std::vector<int>& feed, int start) {
      return m_.forward(feed, start, 0, llama::dot_sequential);  // the decode path's arithmetic
    };
    auto left = [&]() { return stopped ? 0 : int(max_tokens - (long long)toks.size()); };
    const std::vector<float> logits = prefill(prompt, int(prompt.size()) - 1);
    std::vector<int> seq = prompt;
    seq.push_back(emit(logits.data(), -1));
    const spec::Stats st = spec::decode(seq, int(prompt.size()), sr, bug_, V, forward, greedy, emit, left);
    json::Object out{{"id", id}, {"prompt_token_ids", *req.find("prompt_token_ids")}, {"token_ids", toks},
                     {"finish_reason", stopped ? "stop" : "length"}};
    if (k > 0) out.emplace_back("top_logprobs", tops);
    out.emplace_back("timing", json::Object{{"ttft_s", ttft}, {"total_s", since(t0)}});
    out.emplace_back("speculative", json::Object{{"drafted", st.drafted}, {"accepted", st.accepted}, {"drafts", st.drafts}});
    return out;
  }

  // Teacher forcing: prompt + continuation[:-1] through the prompt path; step j is the
  // distribution at position len(prompt) - 1 + j, i.e. given everything before continuation[j].
  Value score(const Value& req, const Value& id) {
    const int V = m_.c.vocab;
    std::vector<int> seq = token_ids(req, "prompt_token_ids", V);
    const std::vector<int> cont = token_ids(req, "continuation_ids", V);
    const long long k = std::max<long long>(1, integer(req, "top_logprobs", 1, 0));
    if (seq.empty()) throw std::runtime_error("\"prompt_token_ids\" is empty");
    if (cont.empty()) return json::Object{{"id", id}, {"steps", json::Array{}}};
    const int n = int(seq.size());
    seq.insert(seq.end(), cont.begin(), cont.end() - 1);
    fits(seq.size(), "the prompt and the continuation but its last id");
    const std::vector<float> logits = prefill(seq, n - 1);
    json::Array steps;
    for (size_t j = 0; j < cont.size(); ++j) {
      const std::vector<double> lp = log_softmax(&logits[j * V], V);
      steps.push_back(json::Object{{"token_id", cont[j]}, {"logprob", lp[cont[j]]}, {"top", pairs(lp, best(lp, k))}});
    }
    return json::Object{{"id", id}, {"steps", steps}};
  }

  // The dump op (dump.hpp): the prompt path over every id, or (mode decode) the prompt path over
  // ids[:decode_from] and then each later id alone through decode(), the path generate takes.
  Value dump(const Value& req, const Value& id) {
    const dump::Request r = dump::read_request(req, token_ids(req, "prompt_token_ids", m_.c.vocab));
    fits(r.ids.size(), "the ids");
    dump::Recorder rec(r, m_.c);
    const int n0 = r.decode_from < 0 ? int(r.ids.size()) : r.decode_from;
    prefill(std::vector<int>(r.ids.begin(), r.ids.begin() + n0), 0, &rec);
    for (int i = n0; i < int(r.ids.size()); ++i) decode(r.ids[i], i, i - n0 + 1, &rec);
    return rec.write(r.directory, id);
  }

 private:
  llama::Model& m_;
  const Prefill mode_;
  const std::vector<long long> eos_;
  const spec::Bug bug_;         // a planted speculation bug (tests only); None in normal use
  const dump::KvBug kv_bug_;    // a planted decode-only KV-cache bug (tests only); none in normal use

  // Decode step `step` (1: the first id after the prompt): one id at position pos through the
  // decode path, with the cache the steps before it left.
  std::vector<float> decode(int tok, int pos, int step, llama::Probe* probe = nullptr) {
    if (kv_bug_.on(step)) {
      float* k = m_.cached_key(kv_bug_.layer, 0);
      std::fill(k, k + m_.c.kv_heads * m_.c.head_dim, 0.f);
    }
    return m_.forward({tok}, pos, 0, llama::dot_sequential, probe);
  }

  void fits(size_t positions, const char* what) const {
    if (positions > size_t(m_.c.max_pos))
      throw std::runtime_error(std::to_string(positions) + " positions (" + what + ") do not fit max_position_embeddings " +
                               std::to_string(m_.c.max_pos));
  }

  // The request's eos_token_ids when it has them, else the model's; none under ignore_eos.
  std::set<long long> request_eos(const Value& req) const {
    std::set<long long> eos;
    if (flag(req, "ignore_eos")) return eos;
    const Value* e = req.find("eos_token_ids");
    if (!e || e->is(Kind::Null)) return std::set<long long>(eos_.begin(), eos_.end());
    if (!e->is(Kind::Array)) throw std::runtime_error("\"eos_token_ids\" must be a list of token ids");
    for (const Value& t : e->a) {
      if (!t.is(Kind::Int) || t.i < 0) throw std::runtime_error("\"eos_token_ids\" must be a list of token ids");
      eos.insert(t.i);
    }
    return eos;
  }

  // The prompt path: toks at positions 0..n-1 (the cache is overwritten from 0, so nothing of
  // an earlier request is seen), the logits of positions logits_from..n-1.
  std::vector<float> prefill(const std::vector<int>& toks, int logits_from, llama::Probe* probe = nullptr) {
    if (mode_ == Prefill::Batched) return m_.forward(toks, 0, logits_from, llama::dot_blocked, probe);
    std::vector<float> out;  // stepwise: one token at a time through the decode path's arithmetic
    for (int i = 0; i < int(toks.size()); ++i) {
      const std::vector<float> l = m_.forward({toks[i]}, i, i >= logits_from ? 0 : 1, llama::dot_sequential, probe);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }
};

int serve(Engine& engine) {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (std::cin.eof()) break;  // EOF inside a line (no trailing \n): the gate died while writing it
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Value req;
    try {
      req = json::parse(line);
    } catch (const json::Error& e) {
      send(error_reply(nullptr, std::string("malformed request line: ") + e.what()));
      continue;
    }
    const Value* op = req.find("op");
    const Value id = req.find("id") ? *req.find("id") : Value();
    if (op && op->is(Kind::String) && op->s == "shutdown") break;
    try {
      if (op && op->is(Kind::String) && op->s == "generate") send(engine.generate(req, id));
      else if (op && op->is(Kind::String) && op->s == "score") send(engine.score(req, id));
      else if (op && op->is(Kind::String) && op->s == "dump") send(engine.dump(req, id));
      else send(error_reply(id, "unsupported op " + (op ? json::dump(*op) : std::string("(none)"))));
    } catch (const std::exception& e) {  // this request fails; the engine goes on
      std::fprintf(stderr, "cpp-engine: request %s: %s\n", json::dump(id).c_str(), e.what());
      send(error_reply(id, e.what()));
    }
  }
  return 0;  // shutdown or EOF
}

int usage(const char* why) {
  std::fprintf(stderr, "cpp-engine: %s\nusage: engine --model DIR [--prefill batched|stepwise]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // The protocol keeps the real stdout; fd 1 then points at stderr, so a stray print cannot
  // corrupt the stream. SIGPIPE ignored: a write to a dead gate fails (then exit 0) instead.
  proto = fdopen(dup(1), "w");
  dup2(2, 1);
  std::signal(SIGPIPE, SIG_IGN);
  std::ios::sync_with_stdio(false);
  std::string model_dir, prefill = "batched";
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const bool has_next = a + 1 < argc;
    if (arg == "--model" && has_next) model_dir = argv[++a];
    else if (arg.rfind("--model=", 0) == 0) model_dir = arg.substr(8);
    else if (arg == "--prefill" && has_next) prefill = argv[++a];
    else if (arg.rfind("--prefill=", 0) == 0) prefill = arg.substr(10);
    else return usage(("unknown argument " + arg).c_str());
  }
  if (model_dir.empty()) return usage("--model DIR is required (a directory with config.json and model.safetensors)");
  if (prefill != "batched" && prefill != "stepwise") return usage(("--prefill " + prefill + ": not batched or stepwise").c_str());
  const char* planted = std::getenv("STRICT_GATE_CPP_SPEC_BUG");  // tests only: speculative.hpp
  const std::string bug_name = planted ? planted : "";
  spec::Bug bug;
  try {
    bug = spec::bug_named(bug_name);
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  const char* kv_planted = std::getenv("STRICT_GATE_CPP_KV_BUG");  // tests only: dump.hpp
  const std::string kv_name = kv_planted ? kv_planted : "";
  try {
    llama::Model model(model_dir);
    const dump::KvBug kv_bug = dump::kv_bug_named(kv_name, model.c.layers);  // a bad one: exit 2 below
    const std::vector<long long> eos = model_eos(model_dir);
    Engine engine(model, prefill == "batched" ? Prefill::Batched : Prefill::Stepwise, eos, bug, kv_bug);
    json::Array eos_json(eos.begin(), eos.end());
    const std::string kv = "float32, " + std::to_string(model.c.max_pos) + " tokens";
    send(json::Object{
        {"hello", PROTOCOL}, {"name", "strict-gate-cpp"}, {"version", VERSION}, {"model", model_dir},
        {"capabilities", json::Array{"generate", "score", "stream", "speculative", "dump", "graft", "dump_decode"}},
        {"versions", json::Object{{"compiler", __VERSION__}, {"c++", std::to_string(__cplusplus)}}},
        {"settings", json::Object{{"prefill", prefill}, {"dtype", "float32"}, {"threads", 1},
                                  {"logprobs", "full vocabulary, log_softmax in double"},
                                  {"tied_head", model.c.tied}, {"model_eos_token_ids", eos_json},
                                  {"speculative", bug_name.empty() ? "ngram (prompt lookup)" : "PLANTED BUG " + bug_name},
                                  {"kv_bug", kv_name.empty() ? "none" : "PLANTED BUG " + kv_name}}},
        // facts the speed arm's matched-config check compares (docs/engine-protocol.md, section 5)
        {"dtype", "float32"}, {"eager", true}, {"kv_cache", kv}, {"prefix_cache", false},
        {"max_context", model.c.max_pos}});
    return serve(engine);
  } catch (const std::exception& e) {  // before the hello: the model cannot be loaded
    std::fprintf(stderr, "cpp-engine: %s\n", e.what());
    return 2;
  }
}
