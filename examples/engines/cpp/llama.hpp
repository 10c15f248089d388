// A Hugging Face Llama checkpoint (config.json + one model.safetensors, F32) and its forward
// pass in float32, batch 1, with a KV cache. Written to be read next to transformers'
// modeling_llama.py: the comments mark the places where a port usually goes wrong.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

namespace llama {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline json::Value read_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::Error& e) {
    throw std::runtime_error(path + ": not JSON: " + e.what());
  }
}

struct Config {
  int vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, max_pos = 0;
  float eps = 1e-6f;
  double rope_theta = 10000.0;
  bool tied = false;
};

inline Config read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  json::Value j = read_json(path);
  // An integer setting; `fallback` (when >= 0) stands in for an absent key.
  auto integer = [&](const char* key, long long fallback = -1) -> int {
    const json::Value* v = j.find(key);
    if (v && v->is(json::Value::Kind::Int) && v->i >= 0 && v->i < (1 << 30)) return int(v->i);
    if ((!v || v->is(json::Value::Kind::Null)) && fallback >= 0) return int(fallback);
    throw std::runtime_error(path + ": \"" + key + "\" missing or not an integer");
  };
  auto refuse_unless = [&](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(path + ": " + what + " is not supported by this engine");
  };
  const json::Value* type = j.find("model_type");
  refuse_unless(type && type->is(json::Value::Kind::String) && type->s == "llama", "a model_type other than llama");
  const json::Value* act = j.find("hidden_act");
  refuse_unless(!act || (act->is(json::Value::Kind::String) && act->s == "silu"), "a hidden_act other than silu");
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    const json::Value* b = j.find(bias);
    refuse_unless(!b || b->is(json::Value::Kind::Null) || (b->is(json::Value::Kind::Bool) && !b->b), std::string(bias));
  }
  Config c;
  c.vocab = integer("vocab_size");
  c.hidden = integer("hidden_size");
  c.intermediate = integer("intermediate_size");
  c.layers = integer("num_hidden_layers");
  c.heads = integer("num_attention_heads");
  c.kv_heads = integer("num_key_value_heads", c.heads);  // fewer than heads: GQA; absent: none
  c.head_dim = integer("head_dim", c.heads > 0 ? c.hidden / c.heads : 0);
  c.max_pos = integer("max_position_embeddings");
  const json::Value* eps = j.find("rms_norm_eps");
  if (!eps || !eps->is_number()) throw std::runtime_error(path + ": \"rms_norm_eps\" missing or not a number");
  c.eps = float(eps->number());  // 1e-5 here; Llama checkpoints ship 1e-5 or 1e-6: read it, never assume
  // transformers 5 writes rope_parameters {rope_theta, rope_type}; older configs a top-level rope_theta
  const json::Value* rope = j.find("rope_parameters");
  const json::Value* theta = rope ? rope->find("rope_theta") : j.find("rope_theta");
  if (theta && theta->is_number()) c.rope_theta = theta->number();
  const json::Value* rtype = rope ? rope->find("rope_type") : nullptr;
  refuse_unless(!rtype || (rtype->is(json::Value::Kind::String) && rtype->s == "default"), "rope scaling");
  const json::Value* scaling = j.find("rope_scaling");
  refuse_unless(!scaling || scaling->is(json::Value::Kind::Null), "rope_scaling");
  const json::Value* tied = j.find("tie_word_embeddings");
  c.tied = tied && tied->is(json::Value::Kind::Bool) && tied->b;  // Llama's default is untied: read the flag
  bool sane = c.vocab > 0 && c.hidden > 0 && c.intermediate > 0 && c.layers > 0 && c.heads > 0 && c.kv_heads > 0 &&
              c.heads % c.kv_heads == 0 && c.head_dim > 0 && c.head_dim % 2 == 0 && c.max_pos > 0;
  if (!sane) throw std::runtime_error(path + ": inconsistent sizes (heads, kv heads, head_dim)");
  return c;
}

// safetensors: 8 bytes little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}}, then the raw data. Offsets are checked against the file before any read.
class Safetensors {
 public:
  explicit Safetensors(const std::string& path) : path_(path), bytes_(read_file(path)) {
    uint16_t probe = 1;
    unsigned char first;
    std::memcpy(&first, &probe, 1);
    if (first != 1) throw std::runtime_error("this engine reads safetensors on little-endian machines only");
    uint64_t n = 0;
    if (bytes_.size() < 8) throw std::runtime_error(path + ": too short for a safetensors file");
    for (int k = 7; k >= 0; --k) n = n << 8 | static_cast<unsigned char>(bytes_[k]);
    if (n > bytes_.size() - 8) throw std::runtime_error(path + ": header length beyond the end of the file");
    try {
      header_ = json::parse(bytes_.substr(8, n));
    } catch (const json::Error& e) {
      throw std::runtime_error(path + ": bad safetensors header: " + e.what());
    }
    data_ = 8 + n;
  }

  bool has(const std::string& name) const { return header_.find(name) != nullptr; }

  // The named F32 tensor, which must have exactly `shape`.
  std::vector<float> f32(const std::string& name, std::vector<long long> shape) const {
    const json::Value* t = header_.find(name);
    if (!t) throw std::runtime_error(path_ + ": no tensor " + name);
    const json::Value* dtype = t->find("dtype");
    const json::Value* shp = t->find("shape");
    const json::Value* off = t->find("data_offsets");
    if (!dtype || dtype->s != "F32")
      throw std::runtime_error(path_ + ": " + name + " is not F32 (this engine computes and loads float32 only)");
    std::vector<long long> got;
    for (const auto& d : shp ? shp->a : json::Array{}) got.push_back(d.i);
    if (got != shape) throw std::runtime_error(path_ + ": " + name + " has another shape than config.json implies");
    long long count = 1;
    for (long long d : shape) count *= d;
    if (!off || off->a.size() != 2 || !off->a[0].is(json::Value::Kind::Int) || !off->a[1].is(json::Value::Kind::Int))
      throw std::runtime_error(path_ + ": " + name + " has no data_offsets");
    long long begin = off->a[0].i, end = off->a[1].i;
    if (begin < 0 || end - begin != count * 4 || static_cast<uint64_t>(end) > bytes_.size() - data_)
      throw std::runtime_error(path_ + ": " + name + " data_offsets do not fit its shape or the file");
    std::vector<float> out(count);
    std::memcpy(out.data(), bytes_.data() + data_ + begin, count * 4);
    return out;
  }

 private:
  std::string path_, bytes_;
  json::Value header_;
  uint64_t data_ = 0;
};

// A dot product: the one thing the --prefill switch changes (see Model::forward).
using Dot = float (*)(const float*, const float*, int);

// Decode path: one running sum, left to right.
inline float dot_sequential(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Batched prefill: 8 partial sums (lane j adds elements j, j+8, j+16, ...) folded pairwise at
// the end, the order a SIMD GEMM kernel sums in. The same products, added in another order: the
// results differ from dot_sequential in the last bits, as a real engine's prefill GEMM differs
// from its decode GEMV.
inline float dot_blocked(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// What a dump sees of a forward pass (dump.hpp): each canonical point's rows as computed (rows of
// positions first, first+1, ...), and a layer input to feed in place of the layer's own (graft).
class Probe {
 public:
  virtual void keep(const std::string& point, const float* rows, int first, int n, int width) = 0;
  virtual const float* graft(int layer) const = 0;  // every position's row, or nullptr: its own input

 protected:
  ~Probe() = default;
};

struct Layer {
  std::vector<float> in_norm, q, k, v, o, post_norm, gate, up, down;
};

class Model {
 public:
  explicit Model(const std::string& dir) : c(read_config(dir)) {
    Safetensors st(dir + "/model.safetensors");
    const long long H = c.hidden, I = c.intermediate, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim;
    embed_ = st.f32("model.embed_tokens.weight", {c.vocab, H});
    norm_ = st.f32("model.norm.weight", {H});
    // Tied weights: the output head IS the embedding matrix (tie_word_embeddings); the file
    // then usually has no lm_head.weight. Untied, the head is its own tensor.
    if (!c.tied) head_ = st.f32("lm_head.weight", {c.vocab, H});
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      layers_.push_back({st.f32(p + "input_layernorm.weight", {H}), st.f32(p + "self_attn.q_proj.weight", {Q, H}),
                         st.f32(p + "self_attn.k_proj.weight", {KV, H}), st.f32(p + "self_attn.v_proj.weight", {KV, H}),
                         st.f32(p + "self_attn.o_proj.weight", {H, Q}),
                         st.f32(p + "post_attention_layernorm.weight", {H}), st.f32(p + "mlp.gate_proj.weight", {I, H}),
                         st.f32(p + "mlp.up_proj.weight", {I, H}), st.f32(p + "mlp.down_proj.weight", {H, I})});
      k_cache_.emplace_back(size_t(c.max_pos) * KV);
      v_cache_.emplace_back(size_t(c.max_pos) * KV);
    }
    // RoPE tables, as transformers builds them: inv_freq[i] = 1 / theta^(2i/d) in float32, the
    // angle pos * inv_freq[i] in float32, then cos and sin of it.
    const int half = c.head_dim / 2;
    cos_.resize(size_t(c.max_pos) * half);
    sin_.resize(cos_.size());
    for (int i = 0; i < half; ++i) {
      float inv = 1.0f / static_cast<float>(std::pow(c.rope_theta, double(2 * i) / c.head_dim));
      for (int pos = 0; pos < c.max_pos; ++pos) {
        float angle = static_cast<float>(pos) * inv;
        cos_[size_t(pos) * half + i] = std::cos(angle);
        sin_[size_t(pos) * half + i] = std::sin(angle);
      }
    }
  }

  const Config c;

  // Runs `toks` at positions start, start+1, ... (the cache holds positions 0..start-1 and
  // gets these), every matmul over all of them at once, each dot product summed by `dot`.
  // Returns the float32 logits of the positions from start + logits_from on, row by row. A
  // probe (a dump) is shown every point, named as docs/localize.md names it, and may graft.
  std::vector<float> forward(const std::vector<int>& toks, int start, int logits_from, Dot dot,
                             Probe* probe = nullptr) {
    const int n = int(toks.size()), H = c.hidden, I = c.intermediate, D = c.head_dim;
    const int Q = c.heads * D, KV = c.kv_heads * D;
    if (start + n > c.max_pos) throw std::runtime_error("more positions than max_position_embeddings");
    std::vector<float> x(size_t(n) * H), h(x.size()), q(size_t(n) * Q), k(size_t(n) * KV), v(k.size());
    std::vector<float> att(q.size()), proj(x.size()), g(size_t(n) * I), u(g.size());
    auto tap = [&](int l, const char* what, const std::vector<float>& rows, int width) {
      if (probe) probe->keep(l < 0 ? what : "layers." + std::to_string(l) + what, rows.data(), start, n, width);
    };
    for (int i = 0; i < n; ++i) std::copy_n(&embed_[size_t(toks[i]) * H], H, &x[size_t(i) * H]);
    tap(-1, "embed", x, H);
    for (int l = 0; l < c.layers; ++l) {
      Layer& L = layers_[l];
      if (const float* fed = probe ? probe->graft(l) : nullptr) std::copy_n(fed + size_t(start) * H, x.size(), x.data());
      rms_norm(x.data(), n, L.in_norm, h.data());
      tap(l, ".attn_norm", h, H);
      matmul(h.data(), n, H, L.q, Q, q.data(), dot);
      matmul(h.data(), n, H, L.k, KV, k.data(), dot);
      matmul(h.data(), n, H, L.v, KV, v.data(), dot);
      tap(l, ".attn.q_proj", q, Q);  // before rotary, as transformers' q_proj/k_proj modules give them
      tap(l, ".attn.k_proj", k, KV);
      tap(l, ".attn.v_proj", v, KV);
      for (int i = 0; i < n; ++i) {
        for (int hd = 0; hd < c.heads; ++hd) rope(&q[size_t(i) * Q + hd * D], start + i);
        for (int hd = 0; hd < c.kv_heads; ++hd) rope(&k[size_t(i) * KV + hd * D], start + i);
      }
      tap(l, ".attn.q_rope", q, Q);  // after rotary, as attention reads them
      tap(l, ".attn.k_rope", k, KV);
      std::copy(k.begin(), k.end(), k_cache_[l].begin() + size_t(start) * KV);
      std::copy(v.begin(), v.end(), v_cache_[l].begin() + size_t(start) * KV);
      for (int i = 0; i < n; ++i) attend(l, &q[size_t(i) * Q], start + i, &att[size_t(i) * Q], dot);
      tap(l, ".attn.core", att, Q);
      matmul(att.data(), n, Q, L.o, H, proj.data(), dot);
      tap(l, ".attn.o_proj", proj, H);
      tap(l, ".attn", proj, H);  // the attention block's output, before the residual add
      for (size_t e = 0; e < x.size(); ++e) x[e] += proj[e];  // residual
      rms_norm(x.data(), n, L.post_norm, h.data());
      tap(l, ".mlp_norm", h, H);
      matmul(h.data(), n, H, L.gate, I, g.data(), dot);
      matmul(h.data(), n, H, L.up, I, u.data(), dot);
      tap(l, ".mlp.gate_proj", g, I);
      tap(l, ".mlp.up_proj", u, I);
      for (size_t e = 0; e < g.size(); ++e) g[e] = g[e] / (1.0f + std::exp(-g[e])) * u[e];  // SwiGLU: silu(gate) * up
      tap(l, ".mlp.act", g, I);
      matmul(g.data(), n, I, L.down, H, proj.data(), dot);
      tap(l, ".mlp.down_proj", proj, H);
      tap(l, ".mlp", proj, H);
      for (size_t e = 0; e < x.size(); ++e) x[e] += proj[e];
      tap(l, "", x, H);  // the layer's output: the residual stream
    }
    const int rows = n - logits_from;
    rms_norm(&x[size_t(logits_from) * H], rows, norm_, h.data());  // the final norm, before the head
    std::vector<float> logits(size_t(rows) * c.vocab);
    matmul(h.data(), rows, H, c.tied ? embed_ : head_, c.vocab, logits.data(), dot);
    if (probe) probe->keep("norm", h.data(), start + logits_from, rows, H);
    if (probe) probe->keep("logits", logits.data(), start + logits_from, rows, c.vocab);
    return logits;
  }

  // The cached key vector (every KV head, after rotary) of `layer` at position `pos`: a planted decode bug
  // (engine.cpp, STRICT_GATE_CPP_KV_BUG) writes here; nothing else outside forward does.
  float* cached_key(int layer, int pos) {
    return &k_cache_.at(layer).at(size_t(pos) * c.kv_heads * c.head_dim);
  }

 private:
  std::vector<float> embed_, norm_, head_, cos_, sin_;
  std::vector<Layer> layers_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: [max_pos][kv_heads * head_dim]

  // y[i] = W x[i] for the n rows of x; W is [out][in], row-major, as torch stores nn.Linear.
  static void matmul(const float* x, int n, int in, const std::vector<float>& w, int out, float* y, Dot dot) {
    if (dot == dot_sequential) return matmul_sequential(x, n, in, w, out, y);
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out; ++o) y[size_t(i) * out + o] = dot(x + size_t(i) * in, &w[size_t(o) * in], in);
  }

  // The decode path's matmul, bit for bit dot_sequential per output (one running sum, left to
  // right, each its own), computed 8 outputs at a time: 8 independent sums keep the FPU busy
  // where one waits on its own previous add, and a block of 8 weight rows is read once for all
  // n rows (the verify pass of speculative decoding runs K+1 rows through it).
  static void matmul_sequential(const float* x, int n, int in, const std::vector<float>& w, int out, float* y) {
    int o = 0;
    for (; o + 8 <= out; o += 8) {
      const float* wr = &w[size_t(o) * in];
      for (int i = 0; i < n; ++i) {
        const float* xi = x + size_t(i) * in;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int e = 0; e < in; ++e)
          for (int j = 0; j < 8; ++j) s[j] += xi[e] * wr[size_t(j) * in + e];
        std::copy_n(s, 8, y + size_t(i) * out + o);
      }
    }
    for (; o < out; ++o)
      for (int i = 0; i < n; ++i) y[size_t(i) * out + o] = dot_sequential(x + size_t(i) * in, &w[size_t(o) * in], in);
  }

  // RMSNorm as LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), THEN times the weight; the eps goes
  // inside the square root (not added to the norm), and the norm is applied to the input of
  // each sublayer (pre-norm), never to the residual stream itself.
  void rms_norm(const float* x, int n, const std::vector<float>& w, float* y) const {
    for (int i = 0; i < n; ++i) {
      const float* r = x + size_t(i) * c.hidden;
      float ss = 0.f;
      for (int e = 0; e < c.hidden; ++e) ss += r[e] * r[e];
      float inv = 1.0f / std::sqrt(ss / c.hidden + c.eps);
      for (int e = 0; e < c.hidden; ++e) y[size_t(i) * c.hidden + e] = w[e] * (r[e] * inv);
    }
  }

  // RoPE, rotate-half layout (HF Llama): element i pairs with element i + d/2, NOT with i + 1.
  // The interleaved layout (pairs 2i, 2i+1) is Meta's original and GGUF's; HF checkpoints
  // permute the q/k weights for rotate-half, so using the interleaved form on them gives
  // fluent-looking but wrong logits.
  void rope(float* vec, int pos) const {
    const int half = c.head_dim / 2;
    const float* cs = &cos_[size_t(pos) * half];
    const float* sn = &sin_[size_t(pos) * half];
    for (int i = 0; i < half; ++i) {
      float a = vec[i], b = vec[i + half];
      vec[i] = a * cs[i] - b * sn[i];
      vec[i + half] = b * cs[i] + a * sn[i];
    }
  }

  // Causal attention of one query (all heads) at position pos over the cache 0..pos. GQA:
  // query head hd reads key/value head hd / (heads / kv_heads).
  void attend(int l, const float* q, int pos, float* out, Dot dot) const {
    const int D = c.head_dim, KV = c.kv_heads * D, group = c.heads / c.kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::vector<float> p(pos + 1);
    for (int hd = 0; hd < c.heads; ++hd) {
      const int kvh = hd / group;
      float m = -INFINITY;
      for (int j = 0; j <= pos; ++j) {
        p[j] = dot(q + hd * D, &k_cache_[l][size_t(j) * KV + kvh * D], D) * scale;
        m = std::max(m, p[j]);
      }
      float sum = 0.f;
      for (int j = 0; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - m));
      float* o = out + hd * D;
      std::fill(o, o + D, 0.f);
      for (int j = 0; j <= pos; ++j) {
        const float w = p[j] / sum;
        const float* vj = &v_cache_[l][size_t(j) * KV + kvh * D];
        for (int e = 0; e < D; ++e) o[e] += w * vj[e];
      }
    }
  }
};

}  // namespace llama
