// The `dump` op (docs/engine-protocol.md, "dump"; docs/localize.md): the activations of the
// canonical points at the positions asked, written as one float32 safetensors file. The forward
// pass shows every point to a Recorder (llama.hpp's Probe), which keeps the asked positions'
// rows; with `graft`, the Recorder hands layer i the reference's `embed` (i = 0) or
// `layers.{i-1}` in place of its own input. engine.cpp runs the passes: one prefill, or (mode
// decode) a prefill of ids[:decode_from] and then one id at a time through the decode path.
//
// Also here: the planted decode-only KV-cache bug the localisation tests find
// (STRICT_GATE_CPP_KV_BUG, tests/test_localize_cpp.py). Off unless that variable is set.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"
#include "llama.hpp"

namespace dump {

// What a request without `points` gets: every layer-level point (embed, layers.N, layers.N.attn,
// layers.N.mlp, norm, logits); the ops inside a layer only when named.
inline bool layer_level(const std::string& p) {
  const auto dots = std::count(p.begin(), p.end(), '.');
  auto ends = [&](const std::string& s) { return p.size() > s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
  return dots <= 1 || (dots == 2 && (ends(".attn") || ends(".mlp")));
}

struct Request {
  std::vector<int> ids, positions;
  std::vector<std::string> points;  // empty: every layer-level point
  std::string directory, graft;     // graft empty: none
  int decode_from = -1;             // -1: one prefill over every id
};

// The request's fields past prompt_token_ids (read by the engine); anything malformed throws,
// which is this request's error reply.
inline Request read_request(const json::Value& req, std::vector<int> ids) {
  using Kind = json::Value::Kind;
  Request r;
  r.ids = std::move(ids);
  const int n = int(r.ids.size());
  if (n == 0) throw std::runtime_error("\"prompt_token_ids\" is empty");
  const json::Value* pos = req.find("positions");
  if (!pos || !pos->is(Kind::Array) || pos->a.empty())
    throw std::runtime_error("\"positions\" must be a non-empty list of indices into prompt_token_ids");
  for (const json::Value& p : pos->a) {
    if (!p.is(Kind::Int) || p.i < 0 || p.i >= n)
      throw std::runtime_error("\"positions\" holds " + json::dump(p) + ", not an index below " + std::to_string(n));
    r.positions.push_back(int(p.i));
  }
  if (const json::Value* pts = req.find("points"); pts && !pts->is(Kind::Null)) {
    if (!pts->is(Kind::Array)) throw std::runtime_error("\"points\" must be a list of point names");
    for (const json::Value& p : pts->a) {
      if (!p.is(Kind::String)) throw std::runtime_error("\"points\" must be a list of point names");
      r.points.push_back(p.s);
    }
  }
  const json::Value* dir = req.find("directory");
  if (!dir || !dir->is(Kind::String) || dir->s.empty()) throw std::runtime_error("\"directory\" must be a path");
  r.directory = dir->s;
  if (const json::Value* g = req.find("graft"); g && !g->is(Kind::Null)) {
    if (!g->is(Kind::String) || g->s.empty()) throw std::runtime_error("\"graft\" must be a path");
    r.graft = g->s;
  }
  const json::Value* mode = req.find("mode");
  if (mode && !mode->is(Kind::Null)) {
    if (!mode->is(Kind::String) || mode->s != "decode") throw std::runtime_error("\"mode\" must be \"decode\"");
    const json::Value* from = req.find("decode_from");
    if (!from || !from->is(Kind::Int) || from->i < 1 || from->i > n)
      throw std::runtime_error("a decode dump needs \"decode_from\" in 1.." + std::to_string(n));
    if (!r.graft.empty()) throw std::runtime_error("a decode dump cannot graft (graft is a prefill-path pass)");
    r.decode_from = int(from->i);
  }
  return r;
}

// Keeps the asked positions' rows of the asked points as the passes go by, in depth order.
class Recorder final : public llama::Probe {
 public:
  Recorder(const Request& r, const llama::Config& c) : positions_(r.positions), asked_(r.points.begin(), r.points.end()) {
    if (!r.graft.empty()) load_graft(r.graft, static_cast<long long>(r.ids.size()), c);
  }

  void keep(const std::string& point, const float* rows, int first, int n, int width) override {
    if (asked_.empty() ? !layer_level(point) : !asked_.count(point)) return;
    auto it = index_.find(point);
    if (it == index_.end()) {
      it = index_.emplace(point, tensors_.size()).first;
      tensors_.push_back({point, width, std::vector<float>(positions_.size() * width), std::vector<bool>(positions_.size())});
    }
    Tensor& t = tensors_[it->second];
    if (t.width != width) throw std::runtime_error("dump: " + point + " changed width between passes");
    for (size_t k = 0; k < positions_.size(); ++k) {
      const int r = positions_[k] - first;
      if (r < 0 || r >= n) continue;
      std::copy_n(rows + size_t(r) * width, width, &t.data[k * width]);
      t.seen[k] = true;
    }
  }

  const float* graft(int layer) const override {
    const auto it = grafts_.find(layer);
    return it == grafts_.end() ? nullptr : it->second.data();
  }

  // <directory>/activations.safetensors, written whole under another name and then renamed into
  // place (never half a file under the name replied), and the reply that names it.
  json::Value write(const std::string& directory, const json::Value& id) const {
    json::Object header;
    json::Array names;
    long long offset = 0;
    for (const Tensor& t : tensors_) {
      if (std::find(t.seen.begin(), t.seen.end(), false) != t.seen.end())
        throw std::runtime_error("dump: " + t.name + " was not computed at every position asked");
      const long long bytes = (long long)t.data.size() * 4;
      header.emplace_back(t.name, json::Object{{"dtype", "F32"},
                                               {"shape", json::Array{(long long)positions_.size(), (long long)t.width}},
                                               {"data_offsets", json::Array{offset, offset + bytes}}});
      names.push_back(t.name);
      offset += bytes;
    }
    std::string head = json::dump(json::Value(header));
    while (head.size() % 8) head += ' ';  // the data starts 8-byte aligned, as safetensors' writer pads it
    const std::string path = directory + "/activations.safetensors", tmp = path + ".part";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error("dump: cannot write " + tmp);
    unsigned char len[8];
    for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>((uint64_t(head.size()) >> (8 * k)) & 0xff);
    bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(head.data(), 1, head.size(), f) == head.size();
    for (const Tensor& t : tensors_) ok = ok && std::fwrite(t.data.data(), 4, t.data.size(), f) == t.data.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw std::runtime_error("dump: writing " + path + " failed");
    }
    return json::Object{{"id", id}, {"path", path}, {"points", names}};
  }

 private:
  struct Tensor {
    std::string name;
    int width;
    std::vector<float> data;  // positions x width, row k for positions_[k]
    std::vector<bool> seen;
  };
  const std::vector<int> positions_;
  const std::set<std::string> asked_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<int, std::vector<float>> grafts_;  // layer -> the input fed to it, every position

  // The reference's layer inputs: `embed` for layer 0, `layers.{i-1}` for layer i, each
  // (every id x hidden) float32; a layer whose input the file lacks keeps its own.
  void load_graft(const std::string& path, long long n, const llama::Config& c) try {
    const llama::Safetensors st(path);
    for (int l = 0; l < c.layers; ++l) {
      const std::string source = l == 0 ? "embed" : "layers." + std::to_string(l - 1);
      if (st.has(source)) grafts_[l] = st.f32(source, {n, c.hidden});
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("\"graft\": ") + e.what());
  }
};

// The planted decode-only bug: from decode step `step` on (step 1 is the first id after the
// prefill), layer `layer`'s cached key at position 0 (every KV head) is zeroed before the step
// runs, so that position's attention score is 0 instead of its own (position 0 is often the
// one most attended to). The prompt path never sees it: prefill, score and a prefill dump stay
// honest, and the next request's prefill writes position 0 again. Speculative verify passes
// (speculative.hpp) do not plant it.
struct KvBug {
  int layer = -1, step = 0;  // layer < 0: none
  bool on(int s) const { return layer >= 0 && s >= step; }
};

// "L:K" (layer L from decode step K), or empty for none.
inline KvBug kv_bug_named(const std::string& text, int layers) {
  if (text.empty()) return {};
  KvBug b;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d:%d%c", &b.layer, &b.step, &tail) != 2 || b.layer < 0 || b.layer >= layers ||
      b.step < 1)
    throw std::runtime_error("STRICT_GATE_CPP_KV_BUG=" + text + ": not LAYER:STEP (a layer below " +
                             std::to_string(layers) + ", a decode step from 1)");
  return b;
}

}  // namespace dump
