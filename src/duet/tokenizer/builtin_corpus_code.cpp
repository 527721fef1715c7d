// Code and data for the built-in corpus (see builtin_corpus.cpp): C++, Python and other
// languages, configuration, logs, tables and numbers, all written for duet.
#include "duet/tokenizer/builtin_corpus_parts.h"

namespace duet {
namespace {

constexpr std::string_view kCpp = R"txt(// A fixed-size ring buffer for single-producer, single-consumer queues.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace demo {

template <typename T>
class RingBuffer {
 public:
  explicit RingBuffer(size_t capacity) : slots_(capacity + 1) {}

  bool push(const T& value) {
    const size_t head = head_.load(std::memory_order_relaxed);
    const size_t next = (head + 1) % slots_.size();
    if (next == tail_.load(std::memory_order_acquire)) return false;  // full
    slots_[head] = value;
    head_.store(next, std::memory_order_release);
    return true;
  }

  std::optional<T> pop() {
    const size_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) return std::nullopt;  // empty
    T value = slots_[tail];
    tail_.store((tail + 1) % slots_.size(), std::memory_order_release);
    return value;
  }

  size_t capacity() const { return slots_.size() - 1; }

 private:
  std::vector<T> slots_;
  std::atomic<size_t> head_{0};
  std::atomic<size_t> tail_{0};
};

struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> data;

  float& at(int64_t r, int64_t c) { return data[r * cols + c]; }
  float at(int64_t r, int64_t c) const { return data[r * cols + c]; }
};

// y = x * w^T, where x is [n, k] and w is [m, k].
void matmul(const Matrix& x, const Matrix& w, Matrix& y) {
  y.rows = x.rows;
  y.cols = w.rows;
  y.data.assign(static_cast<size_t>(y.rows * y.cols), 0.0f);
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < x.cols; ++k) sum += x.at(i, k) * w.at(j, k);
      y.at(i, j) = sum;
    }
  }
}

float rms(const std::vector<float>& v) {
  double sum = 0.0;
  for (float f : v) sum += static_cast<double>(f) * f;
  return v.empty() ? 0.0f : static_cast<float>(std::sqrt(sum / v.size()));
}

enum class Status { kOk, kNotFound, kInvalidArgument, kInternal };

const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kNotFound: return "not found";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace demo

int main(int argc, char** argv) {
  demo::RingBuffer<int> queue(8);
  for (int i = 0; i < 10; ++i) {
    if (!queue.push(i * i)) std::printf("queue full at %d\n", i);
  }
  while (auto v = queue.pop()) std::printf("%d ", *v);
  std::printf("\n");
  return argc > 1 ? 1 : 0;
}

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

template <typename Key, typename Value>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}
  Value* find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  void insert(const Key& key, Value value) {
    if (Value* v = find(key)) { *v = std::move(value); return; }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }
 private:
  size_t capacity_;
  std::list<std::pair<Key, Value>> order_;
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator> index_;
};
)txt";

constexpr std::string_view kPython = R"txt(import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Request:
    request_id: str
    prompt: str
    max_tokens: int = 128
    temperature: float = 0.7
    stop: List[str] = field(default_factory=list)


def softmax(logits: List[float]) -> List[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def top_k(probs: List[float], k: int) -> List[int]:
    order = sorted(range(len(probs)), key=lambda i: probs[i], reverse=True)
    return order[:k]


class BlockPool:
    """Hands out fixed-size blocks and takes them back."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.block_size = block_size
        self.free: List[int] = list(range(num_blocks))
        self.ref_counts: Dict[int, int] = {}

    def allocate(self) -> Optional[int]:
        if not self.free:
            return None
        block = self.free.pop()
        self.ref_counts[block] = 1
        return block

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            del self.ref_counts[block]
            self.free.append(block)

    def __len__(self) -> int:
        return len(self.free)


def load_config(path: str) -> dict:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config at {path!r}")
    with open(path, "r", encoding="utf-8") as f:
        config = json.load(f)
    for key in ("hidden_size", "num_layers", "vocab_size"):
        if key not in config:
            raise KeyError(f"config is missing {key}")
    return config


def chunks(items, size):
    for start in range(0, len(items), size):
        yield items[start:start + size]


if __name__ == "__main__":
    pool = BlockPool(num_blocks=4)
    blocks = [pool.allocate() for _ in range(5)]
    print("allocated:", blocks, "free:", len(pool))
    probs = softmax([1.0, 2.0, 3.0, 0.5])
    print("top-2:", top_k(probs, 2), [round(p, 3) for p in probs])
    for batch in chunks(list(range(10)), 3):
        print(batch)
)txt";

constexpr std::string_view kData = R"txt({
  "model": "duet-tiny",
  "hidden_size": 256,
  "num_layers": 4,
  "num_attention_heads": 8,
  "num_key_value_heads": 2,
  "intermediate_size": 688,
  "vocab_size": 4096,
  "rope_theta": 10000.0,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 4096,
  "tie_word_embeddings": false
}

| step | loss   | tokens/s | memory (GiB) |
|------|--------|----------|--------------|
| 0    | 10.412 | 0        | 1.25         |
| 100  | 6.873  | 48,213   | 3.50         |
| 200  | 5.104  | 51,877   | 3.50         |
| 500  | 3.998  | 52,940   | 3.75         |
| 1000 | 3.211  | 53,006   | 3.75         |

Timings: prefill 1,024 tokens in 0.183 s (5,595.6 tok/s); decode 256 tokens in 4.72 s (54.2 tok/s).
Latency percentiles: p50 = 12.5 ms, p90 = 18.0 ms, p99 = 41.3 ms, max = 97.8 ms.
Version 2.4.1 was released on 2024-03-15 at 09:30:00 UTC; version 2.5.0 followed on 2024-06-01.
The answer is 42. Pi is about 3.14159265358979, e is about 2.718281828, and the square root of 2 is 1.41421356.
Phone: +1 (555) 010-0199. Order #A-1093 shipped 3 boxes weighing 2.5 kg, 750 g and 12.25 lb.
Powers of two: 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536 131072 1048576.
Hex: 0x00 0x1F 0x7F 0x80 0xFF 0xDEADBEEF 0xCAFEBABE; binary: 0b1010 0b11110000; octal: 0o755.
Primes: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97.
Money: $19.99, €5,00, £3.50, ¥1200; discounts of 10%, 25% and 50% apply until 31/12/2025.
Coordinates: (48.8566, 2.3522), (-33.8688, 151.2093), (40.7128, -74.0060).

$ ./duet serve --model models/tiny.gguf --port 8080 --threads 8 --ctx-size 4096
[2025-01-07 14:02:11.532] [info] loaded 4 layers, 12.6 MiB of weights in 0.08 s
[2025-01-07 14:02:11.533] [info] listening on http://127.0.0.1:8080
[2025-01-07 14:02:15.004] [warn] request 17: prompt of 5000 tokens exceeds the context (4096)
$ curl -s http://127.0.0.1:8080/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" world!","finish_reason":"stop"}]}

Punctuation and symbols: a, b; c: d. e! f? "quoted" 'single' (round) [square] {curly} <angle>
path/to/file.txt C:\Windows\System32 ~/.config/duet/config.toml #include <vector> a->b a::b a&&b a||b
x += 1; y -= 2; z *= 3; w /= 4; v %= 5; u <<= 1; t >>= 2; s ^= 0xFF; r &= ~mask; q |= flag;
i++ --j !k a == b a != b a <= b a >= b a <=> b ... -- --- ---- ===== ***** ##### @user #tag 100%
Ellipsis… em dash — en dash – bullet • arrows → ← ↑ ↓ ⇒ math ≤ ≥ ≠ ≈ ∞ ∑ ∏ √ ∫ ± × ÷ ° µ
)txt";

constexpr std::string_view kCpp2 = R"txt(#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace demo {

// A minimal thread pool: submit() queues a task, the workers run tasks in order.
class ThreadPool {
 public:
  explicit ThreadPool(size_t num_threads) {
    for (size_t i = 0; i < num_threads; ++i) {
      workers_.emplace_back([this] { run(); });
    }
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) throw std::runtime_error("submit() on a stopped pool");
      tasks_.push(std::move(task));
    }
    cv_.notify_one();
  }

  size_t size() const { return workers_.size(); }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (stopping_ && tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop();
      }
      task();
    }
  }

  std::vector<std::thread> workers_;
  std::queue<std::function<void()>> tasks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

// Splits [0, n) into chunks and runs fn(begin, end) on each chunk in parallel.
template <typename Fn>
void parallel_for(ThreadPool& pool, int64_t n, int64_t chunk, Fn fn) {
  std::mutex mutex;
  std::condition_variable done;
  int64_t pending = (n + chunk - 1) / chunk;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    pool.submit([&, begin, end] {
      fn(begin, end);
      std::lock_guard<std::mutex> lock(mutex);
      if (--pending == 0) done.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  done.wait(lock, [&] { return pending == 0; });
}

struct Error {
  enum class Code { kInvalidArgument, kNotFound, kUnsupported, kInternal };
  Code code;
  std::string message;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)), ok_(true) {}
  Result(Error error) : error_(std::move(error)), ok_(false) {}
  bool ok() const { return ok_; }
  const T& value() const { return value_; }
  const Error& error() const { return error_; }

 private:
  T value_{};
  Error error_{};
  bool ok_;
};

Result<int> parse_int(const std::string& text) {
  if (text.empty()) return Error{Error::Code::kInvalidArgument, "empty string"};
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return Error{Error::Code::kInvalidArgument, "not a digit: " + std::string(1, c)};
    value = value * 10 + (c - '0');
  }
  return value;
}

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void softmax(float* x, int64_t n) {
  float max_value = x[0];
  for (int64_t i = 1; i < n; ++i) max_value = std::max(max_value, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void rope(float* q, int64_t head_dim, int64_t position, float theta) {
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float freq = std::pow(theta, -static_cast<float>(i) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(position) * freq;
    const float c = std::cos(angle);
    const float s = std::sin(angle);
    const float a = q[i];
    const float b = q[i + 1];
    q[i] = a * c - b * s;
    q[i + 1] = a * s + b * c;
  }
}

}  // namespace demo

TEST(ParseInt, AcceptsDigits) {
  EXPECT_TRUE(demo::parse_int("123").ok());
  EXPECT_EQ(demo::parse_int("123").value(), 123);
  EXPECT_FALSE(demo::parse_int("").ok());
  EXPECT_FALSE(demo::parse_int("12a").ok());
}

TEST(Softmax, SumsToOne) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  demo::softmax(x.data(), static_cast<int64_t>(x.size()));
  float sum = 0.0f;
  for (float v : x) sum += v;
  EXPECT_NEAR(sum, 1.0f, 1e-6f);
  EXPECT_GT(x[3], x[2]);
}
)txt";

constexpr std::string_view kPython2 = R"txt(#!/usr/bin/env python3
"""Trains a tiny model on random data and reports the loss every few steps."""

import argparse
import random
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="train a tiny model")
    parser.add_argument("--steps", type=int, default=100, help="number of training steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


class Linear:
    def __init__(self, n_in, n_out, rng):
        scale = 1.0 / (n_in ** 0.5)
        self.weight = [[rng.uniform(-scale, scale) for _ in range(n_in)] for _ in range(n_out)]
        self.bias = [0.0] * n_out

    def __call__(self, x):
        return [sum(w * v for w, v in zip(row, x)) + b for row, b in zip(self.weight, self.bias)]


def mse(pred, target):
    return sum((p - t) ** 2 for p, t in zip(pred, target)) / len(pred)


def train(args):
    rng = random.Random(args.seed)
    layer = Linear(4, 2, rng)
    start = time.time()
    for step in range(1, args.steps + 1):
        x = [rng.random() for _ in range(4)]
        target = [sum(x), x[0] - x[1]]
        pred = layer(x)
        loss = mse(pred, target)
        for i, row in enumerate(layer.weight):
            grad = 2.0 * (pred[i] - target[i]) / len(pred)
            for j in range(len(row)):
                row[j] -= args.lr * grad * x[j]
            layer.bias[i] -= args.lr * grad
        if step % 10 == 0 or args.verbose:
            print(f"step {step:4d}  loss {loss:.6f}  elapsed {time.time() - start:.2f}s")
    return layer


def test_mse_is_zero_for_equal_inputs():
    assert mse([1.0, 2.0], [1.0, 2.0]) == 0.0


def test_linear_shapes():
    layer = Linear(3, 5, random.Random(1))
    assert len(layer([0.0, 1.0, 2.0])) == 5


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            yield line


def count_words(lines):
    counts = {}
    for line in lines:
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


async def fetch_all(client, urls, limit=4):
    import asyncio
    semaphore = asyncio.Semaphore(limit)

    async def fetch(url):
        async with semaphore:
            response = await client.get(url, timeout=10)
            response.raise_for_status()
            return response.json()

    return await asyncio.gather(*(fetch(u) for u in urls))


if __name__ == "__main__":
    args = parse_args()
    try:
        train(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
)txt";

constexpr std::string_view kShell = R"txt(#!/usr/bin/env bash
set -euo pipefail

BUILD_DIR="${BUILD_DIR:-build}"
JOBS="$(nproc)"

echo "configuring in ${BUILD_DIR} with ${JOBS} jobs"
cmake -S . -B "${BUILD_DIR}" -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=ON
cmake --build "${BUILD_DIR}" -j "${JOBS}"
ctest --test-dir "${BUILD_DIR}" --output-on-failure -j "${JOBS}"

for model in models/*.gguf; do
  if [[ -f "${model}" ]]; then
    echo "== ${model}"
    ./"${BUILD_DIR}"/duet info "${model}" | head -n 20
  fi
done

if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is required for the reference tests" >&2
  exit 1
fi

grep -rn "TODO" src/ | wc -l
find . -name "*.cpp" -newer CMakeLists.txt -print
tar -czf release.tar.gz --exclude=".git" --exclude="build*" .
du -sh "${BUILD_DIR}"

cmake_minimum_required(VERSION 3.25)
project(demo VERSION 1.0 LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
add_library(demo_core src/core.cpp src/util.cpp)
target_include_directories(demo_core PUBLIC include)
add_executable(demo src/main.cpp)
target_link_libraries(demo PRIVATE demo_core Threads::Threads)
enable_testing()
add_test(NAME demo_test COMMAND demo --self-test)

all: build
build:
	cmake --build build -j8
test: build
	ctest --test-dir build --output-on-failure
clean:
	rm -rf build
.PHONY: all build test clean

server:
  host: 0.0.0.0
  port: 8080
  api_keys:
    - sk-test-0001
    - sk-test-0002
model:
  path: models/tiny.gguf
  context: 4096
  device_map:
    - layers: 0-11
      device: cuda:0
    - layers: 12-23
      device: cpu
scheduler:
  max_batch_tokens: 8192
  max_running: 64
  chunked_prefill: true
logging:
  level: info
  format: json
)txt";

constexpr std::string_view kMisc = R"txt(// TypeScript
interface Message {
  role: "system" | "user" | "assistant";
  content: string;
}

async function chat(messages: Message[], maxTokens = 256): Promise<string> {
  const response = await fetch("http://127.0.0.1:8080/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "tiny", messages, max_tokens: maxTokens, stream: false }),
  });
  if (!response.ok) {
    throw new Error(`request failed: ${response.status} ${response.statusText}`);
  }
  const data = await response.json();
  return data.choices[0].message.content;
}

// Rust
use std::collections::HashMap;

fn word_counts(text: &str) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(f64),
    Ident(String),
    Op(char),
}

impl Token {
    fn is_op(&self) -> bool {
        matches!(self, Token::Op(_))
    }
}

// Go
package main

import (
	"fmt"
	"net/http"
	"time"
)

type Server struct {
	addr    string
	timeout time.Duration
}

func (s *Server) Run() error {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: s.addr, Handler: mux, ReadTimeout: s.timeout}
	return srv.ListenAndServe()
}

-- SQL
SELECT u.name, COUNT(r.id) AS requests, AVG(r.latency_ms) AS avg_latency
FROM users AS u
LEFT JOIN requests AS r ON r.user_id = u.id
WHERE r.created_at >= '2025-01-01'
GROUP BY u.name
HAVING COUNT(r.id) > 10
ORDER BY avg_latency DESC;

INSERT INTO requests (user_id, prompt_tokens, completion_tokens, latency_ms) VALUES (1, 512, 128, 843), (2, 64, 32, 120);
UPDATE users SET active = FALSE WHERE last_seen < NOW() - INTERVAL '90 days';

diff --git a/src/cache.cpp b/src/cache.cpp
index 3f2a1c0..8b9d4e1 100644
--- a/src/cache.cpp
+++ b/src/cache.cpp
@@ -41,7 +41,9 @@ std::optional<int> BlockPool::allocate() {
   if (free_.empty()) {
-    return -1;
+    return std::nullopt;
   }
+  const int block = free_.back();
+  free_.pop_back();
+  ref_counts_[block] = 1;
-  return free_.pop_back();
+  return block;
 }

id,name,tokens,latency_ms,ok
1,alpha,128,12.5,true
2,beta,256,25.1,true
3,gamma,512,49.9,false
4,delta,1024,101.2,true
5,epsilon,2048,199.7,true

timestamp            level  message
2025-02-03T10:00:01Z INFO   server started on 127.0.0.1:8080
2025-02-03T10:00:05Z INFO   request 1 done: 42 prompt tokens, 17 completion tokens, 0.21 s
2025-02-03T10:00:06Z WARN   request 2 cancelled by the client after 3 tokens
2025-02-03T10:00:09Z ERROR  request 3 failed: prompt of 9000 tokens is longer than the context of 4096
2025-02-03T10:00:12Z INFO   cache: 512 blocks in use, 1536 free, hit rate 37.5%

Math: f(x) = 3x^2 + 2x - 7; f'(x) = 6x + 2; the integral of x^2 from 0 to 1 is 1/3 = 0.3333.
E = mc^2, a^2 + b^2 = c^2, sum_{i=1}^{n} i = n(n+1)/2, log2(1024) = 10, 2^10 = 1024, 10^6 = 1,000,000.
Units: 1 KiB = 1024 bytes, 1 MiB = 1,048,576 bytes, 1 GB = 10^9 bytes; 3.2 GHz, 25 W, 80 °C, 5 ms, 120 µs, 400 ns.
)txt";
constexpr std::string_view kCpp3 = R"txt(// A tiny expression language: lexer, parser and evaluator.
#include <cctype>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace calc {

enum class TokenKind { kNumber, kIdent, kPlus, kMinus, kStar, kSlash, kLParen, kRParen, kAssign, kEnd };

struct Token {
  TokenKind kind;
  std::string text;
  double number = 0.0;
  size_t offset = 0;
};

class Lexer {
 public:
  explicit Lexer(std::string_view source) : source_(source) {}

  std::vector<Token> tokenize() {
    std::vector<Token> tokens;
    while (true) {
      skip_whitespace();
      if (pos_ >= source_.size()) {
        tokens.push_back({TokenKind::kEnd, "", 0.0, pos_});
        return tokens;
      }
      const char c = source_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
        tokens.push_back(number());
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        tokens.push_back(identifier());
      } else {
        tokens.push_back(symbol());
      }
    }
  }

 private:
  void skip_whitespace() {
    while (pos_ < source_.size() && std::isspace(static_cast<unsigned char>(source_[pos_]))) ++pos_;
  }

  Token number() {
    const size_t start = pos_;
    while (pos_ < source_.size() && (std::isdigit(static_cast<unsigned char>(source_[pos_])) || source_[pos_] == '.')) {
      ++pos_;
    }
    const std::string text(source_.substr(start, pos_ - start));
    return {TokenKind::kNumber, text, std::stod(text), start};
  }

  Token identifier() {
    const size_t start = pos_;
    while (pos_ < source_.size() && (std::isalnum(static_cast<unsigned char>(source_[pos_])) || source_[pos_] == '_')) {
      ++pos_;
    }
    return {TokenKind::kIdent, std::string(source_.substr(start, pos_ - start)), 0.0, start};
  }

  Token symbol() {
    const size_t start = pos_++;
    switch (source_[start]) {
      case '+': return {TokenKind::kPlus, "+", 0.0, start};
      case '-': return {TokenKind::kMinus, "-", 0.0, start};
      case '*': return {TokenKind::kStar, "*", 0.0, start};
      case '/': return {TokenKind::kSlash, "/", 0.0, start};
      case '(': return {TokenKind::kLParen, "(", 0.0, start};
      case ')': return {TokenKind::kRParen, ")", 0.0, start};
      case '=': return {TokenKind::kAssign, "=", 0.0, start};
      default:
        throw std::invalid_argument("unexpected character '" + std::string(1, source_[start]) + "' at offset " +
                                    std::to_string(start));
    }
  }

  std::string_view source_;
  size_t pos_ = 0;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  enum class Kind { kNumber, kVariable, kBinary, kNegate } kind;
  double value = 0.0;
  std::string name;
  char op = 0;
  NodePtr left;
  NodePtr right;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  NodePtr parse_expression() {
    NodePtr left = parse_term();
    while (peek().kind == TokenKind::kPlus || peek().kind == TokenKind::kMinus) {
      const char op = next().text[0];
      left = binary(op, std::move(left), parse_term());
    }
    return left;
  }

 private:
  NodePtr parse_term() {
    NodePtr left = parse_factor();
    while (peek().kind == TokenKind::kStar || peek().kind == TokenKind::kSlash) {
      const char op = next().text[0];
      left = binary(op, std::move(left), parse_factor());
    }
    return left;
  }

  NodePtr parse_factor() {
    const Token& token = next();
    switch (token.kind) {
      case TokenKind::kNumber: {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kNumber;
        node->value = token.number;
        return node;
      }
      case TokenKind::kIdent: {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kVariable;
        node->name = token.text;
        return node;
      }
      case TokenKind::kMinus: {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kNegate;
        node->left = parse_factor();
        return node;
      }
      case TokenKind::kLParen: {
        NodePtr inner = parse_expression();
        expect(TokenKind::kRParen, "')'");
        return inner;
      }
      default:
        throw std::invalid_argument("expected a number, a name or '(' at offset " + std::to_string(token.offset));
    }
  }

  static NodePtr binary(char op, NodePtr left, NodePtr right) {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kBinary;
    node->op = op;
    node->left = std::move(left);
    node->right = std::move(right);
    return node;
  }

  const Token& peek() const { return tokens_[pos_]; }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  void expect(TokenKind kind, const char* what) {
    if (peek().kind != kind) throw std::invalid_argument(std::string("expected ") + what);
    next();
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

double evaluate(const Node& node, const std::map<std::string, double>& variables) {
  switch (node.kind) {
    case Node::Kind::kNumber: return node.value;
    case Node::Kind::kVariable: {
      auto it = variables.find(node.name);
      if (it == variables.end()) throw std::invalid_argument("unknown variable '" + node.name + "'");
      return it->second;
    }
    case Node::Kind::kNegate: return -evaluate(*node.left, variables);
    case Node::Kind::kBinary: {
      const double a = evaluate(*node.left, variables);
      const double b = evaluate(*node.right, variables);
      switch (node.op) {
        case '+': return a + b;
        case '-': return a - b;
        case '*': return a * b;
        case '/':
          if (b == 0.0) throw std::domain_error("division by zero");
          return a / b;
      }
    }
  }
  throw std::logic_error("unreachable");
}

}  // namespace calc
)txt";

constexpr std::string_view kPython3 = R"txt(import csv
import statistics
from collections import Counter, defaultdict
from pathlib import Path


def load_requests(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = []
        for row in reader:
            row["tokens"] = int(row["tokens"])
            row["latency_ms"] = float(row["latency_ms"])
            row["ok"] = row["ok"].lower() == "true"
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    latencies = sorted(r["latency_ms"] for r in rows if r["ok"])
    if not latencies:
        return {"count": 0}

    def percentile(p: float) -> float:
        index = min(len(latencies) - 1, int(round(p / 100.0 * (len(latencies) - 1))))
        return latencies[index]

    return {
        "count": len(rows),
        "failed": sum(1 for r in rows if not r["ok"]),
        "mean_ms": statistics.mean(latencies),
        "p50_ms": percentile(50),
        "p90_ms": percentile(90),
        "p99_ms": percentile(99),
        "tokens": sum(r["tokens"] for r in rows),
    }


def group_by(rows, key):
    groups = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return dict(groups)


def most_common_words(texts, n=10):
    counter = Counter()
    for text in texts:
        counter.update(word.lower().strip(".,!?;:") for word in text.split())
    return counter.most_common(n)


class Tokenizer:
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.inverse = {i: t for t, i in vocab.items()}

    def encode_word(self, word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == float("inf"):
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.vocab[p] for p in parts]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.inverse[i] for i in ids)


if __name__ == "__main__":
    rows = load_requests(Path("requests.csv"))
    for name, summary in sorted((k, summarize(v)) for k, v in group_by(rows, "name").items()):
        print(f"{name:>10}: {summary}")
)txt";

constexpr std::string_view kWeb = R"txt(# duet-tiny

A small model for tests. Its weights are random, so its answers mean nothing, but every layer runs.

## Quick start

```bash
duet make-model --arch llama --layers 2 --hidden 64 --vocab 4096 -o tiny.gguf
duet run tiny.gguf --prompt "Hello" --max-tokens 16
duet serve tiny.gguf --port 8080
```

## Options

| option | default | meaning |
|--------|---------|---------|
| `--threads` | all cores | worker threads for the CPU backend |
| `--ctx-size` | 4096 | the longest context a request may use |
| `--batch-tokens` | 2048 | tokens processed per scheduler step |
| `--seed` | 0 | random seed for sampling |

## API

`POST /v1/completions` takes `{"prompt": "...", "max_tokens": 16}` and returns the generated text.
`POST /v1/chat/completions` takes a list of messages and applies the model's chat template.
`GET /health` answers 200 when the engine is ready and 503 while it loads or after a fault.
`GET /metrics` exposes counters and histograms in the Prometheus text format.

<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>duet dashboard</title>
  <style>
    body { font-family: sans-serif; margin: 2rem; color: #222; }
    .card { border: 1px solid #ccc; border-radius: 8px; padding: 1rem; margin-bottom: 1rem; }
    .ok { color: #080; } .error { color: #c00; }
    table { border-collapse: collapse; width: 100%; }
    td, th { border-bottom: 1px solid #eee; padding: 0.25rem 0.5rem; text-align: left; }
  </style>
</head>
<body>
  <h1>Engine status</h1>
  <div class="card"><span class="ok">healthy</span> &mdash; 3 requests running, 5 waiting</div>
  <table>
    <tr><th>id</th><th>prompt tokens</th><th>generated</th><th>state</th></tr>
    <tr><td>17</td><td>512</td><td>40</td><td>running</td></tr>
    <tr><td>18</td><td>64</td><td>0</td><td>waiting</td></tr>
  </table>
  <script>
    setInterval(async () => {
      const r = await fetch("/metrics");
      document.title = r.ok ? "duet: ok" : "duet: down";
    }, 5000);
  </script>
</body>
</html>

{"id": "chatcmpl-42", "object": "chat.completion", "created": 1735689600, "model": "tiny",
 "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
              "finish_reason": "stop"}],
 "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}}
{"error": {"message": "max_tokens must be positive, got -5", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
data: {"id":"chatcmpl-43","choices":[{"index":0,"delta":{"content":"Hel"}}]}
data: {"id":"chatcmpl-43","choices":[{"index":0,"delta":{"content":"lo"}}]}
data: {"id":"chatcmpl-43","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}
data: [DONE]

    .text
    .globl  dot
dot:
    vxorps  %ymm0, %ymm0, %ymm0
    xorl    %eax, %eax
.Lloop:
    vmovups (%rdi,%rax,4), %ymm1
    vfmadd231ps (%rsi,%rax,4), %ymm1, %ymm0
    addq    $8, %rax
    cmpq    %rdx, %rax
    jb      .Lloop
    ret
)txt";

constexpr std::string_view kCpp4 = R"txt(// Block bookkeeping for a paged key-value cache: ids and reference counts only, no tensors.
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

namespace demo {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
    for (int32_t id = 0; id < num_blocks; ++id) free_.push_back(id);
  }

  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }

  // An empty optional means "no block left": the scheduler preempts a request and tries again.
  std::optional<int32_t> allocate() {
    if (free_.empty()) return std::nullopt;
    const int32_t id = free_.front();
    free_.pop_front();
    ref_counts_[id] = 1;
    return id;
  }

  void retain(int32_t id) { ++ref_counts_[id]; }

  void release(int32_t id) {
    if (--ref_counts_[id] == 0) free_.push_back(id);
  }

 private:
  std::vector<int32_t> ref_counts_;
  std::deque<int32_t> free_;
};

struct Sequence {
  int64_t request_id = 0;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> block_table;
  int64_t num_computed_tokens = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size) : pool_(num_blocks), block_size_(block_size) {}

  int32_t blocks_needed(const Sequence& seq, int64_t num_new_tokens) const {
    const int64_t total = seq.num_computed_tokens + num_new_tokens;
    const int64_t blocks = (total + block_size_ - 1) / block_size_;
    return static_cast<int32_t>(blocks - static_cast<int64_t>(seq.block_table.size()));
  }

  bool can_append(const Sequence& seq, int64_t num_new_tokens) const {
    return blocks_needed(seq, num_new_tokens) <= pool_.num_free();
  }

  bool append(Sequence& seq, int64_t num_new_tokens) {
    const int32_t needed = blocks_needed(seq, num_new_tokens);
    if (needed > pool_.num_free()) return false;
    for (int32_t i = 0; i < needed; ++i) seq.block_table.push_back(*pool_.allocate());
    return true;
  }

  void free(Sequence& seq) {
    for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool_.release(*it);
    seq.block_table.clear();
    seq.num_computed_tokens = 0;
  }

  // Slot of each new token: block id * block size + offset inside the block.
  std::vector<int64_t> slot_mapping(const Sequence& seq, int64_t num_new_tokens) const {
    std::vector<int64_t> slots;
    slots.reserve(static_cast<size_t>(num_new_tokens));
    for (int64_t pos = seq.num_computed_tokens; pos < seq.num_computed_tokens + num_new_tokens; ++pos) {
      const int32_t block = seq.block_table[static_cast<size_t>(pos / block_size_)];
      slots.push_back(static_cast<int64_t>(block) * block_size_ + pos % block_size_);
    }
    return slots;
  }

 private:
  BlockPool pool_;
  int32_t block_size_;
};

// Chained hash of full blocks: each block's hash covers its tokens and the hash before it.
uint64_t hash_block(uint64_t parent, const int32_t* tokens, int32_t n) {
  uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;
  for (int32_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(tokens[i]));
    h *= 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace demo

TEST(KvCacheManager, AppendsAndFreesBlocks) {
  demo::KvCacheManager manager(/*num_blocks=*/4, /*block_size=*/16);
  demo::Sequence seq;
  seq.token_ids.assign(40, 7);
  ASSERT_TRUE(manager.append(seq, 40));
  EXPECT_EQ(seq.block_table.size(), 3u);
  seq.num_computed_tokens = 40;
  EXPECT_TRUE(manager.can_append(seq, 8));
  EXPECT_FALSE(manager.can_append(seq, 40));
  const std::vector<int64_t> slots = manager.slot_mapping(seq, 2);
  EXPECT_EQ(slots.size(), 2u);
  manager.free(seq);
  EXPECT_TRUE(seq.block_table.empty());
}
)txt";

constexpr std::string_view kPython4 = R"txt(import http.client
import json
import socket
import subprocess
import time
import unittest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.proc = subprocess.Popen(["./build/duet", "serve", "tiny.gguf", "--port", str(cls.port)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                status, _ = cls.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy in 30 seconds")

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=10)

    @classmethod
    def request(cls, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, json.loads(data) if data else None

    def test_completion(self):
        status, body = self.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        self.assertEqual(status, 200)
        self.assertEqual(body["object"], "text_completion")
        self.assertLessEqual(body["usage"]["completion_tokens"], 4)

    def test_rejects_negative_max_tokens(self):
        status, body = self.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": -1})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["param"], "max_tokens")

    def test_unknown_path(self):
        status, _ = self.request("GET", "/v1/nothing")
        self.assertEqual(status, 404)

    def test_greedy_is_deterministic(self):
        payload = {"prompt": "The cache", "max_tokens": 8, "temperature": 0}
        first = self.request("POST", "/v1/completions", payload)[1]["choices"][0]["text"]
        second = self.request("POST", "/v1/completions", payload)[1]["choices"][0]["text"]
        self.assertEqual(first, second)


if __name__ == "__main__":
    unittest.main(verbosity=2)
)txt";

constexpr std::string_view kLogs = R"txt(2025-03-01 08:00:00.001 I engine: model tiny.gguf, 2 layers, hidden 64, vocab 4096, context 4096
2025-03-01 08:00:00.002 I engine: device map: layers 0-1 -> cpu (8 threads)
2025-03-01 08:00:00.010 I cache: 2048 blocks of 16 tokens (32768 tokens, 8.0 MiB)
2025-03-01 08:00:00.011 I server: listening on 127.0.0.1:8080
2025-03-01 08:00:01.250 I request 1: 37 prompt tokens, max 64, temperature 0.70, top_p 0.95
2025-03-01 08:00:01.252 D scheduler: step 1: 1 running, 0 waiting, 37 tokens (prefill 37, decode 0)
2025-03-01 08:00:01.260 D scheduler: step 2: 1 running, 0 waiting, 1 tokens (prefill 0, decode 1)
2025-03-01 08:00:01.498 I request 1: finished (stop), 64 tokens in 0.248 s, 258.1 tokens/s
2025-03-01 08:00:02.000 I request 2: 4096 prompt tokens, max 128
2025-03-01 08:00:02.001 D scheduler: step 33: chunked prefill 2048 of 4096 tokens for request 2
2025-03-01 08:00:02.090 D scheduler: step 34: chunked prefill 4096 of 4096 tokens for request 2
2025-03-01 08:00:02.091 W request 2: prompt 4096 + max_tokens 128 exceeds the context 4096; max_tokens lowered to 0
2025-03-01 08:00:02.092 I request 2: finished (length), 0 tokens
2025-03-01 08:00:03.500 I request 3: prefix cache hit, 32 of 40 prompt tokens reused
2025-03-01 08:00:04.000 E request 4: client disconnected after 12 tokens; blocks freed
2025-03-01 08:00:05.000 I metrics: 4 requests, 3 finished, 1 cancelled, mean TTFT 8.1 ms, mean TPOT 3.9 ms

$ duet bench --model tiny.gguf --threads 1,2,4,8 --prompt 512 --gen 128
model      threads  test    tokens/s   stddev
tiny.gguf  1        pp512   1843.20    12.40
tiny.gguf  1        tg128   412.70     3.10
tiny.gguf  2        pp512   3521.90    20.80
tiny.gguf  2        tg128   761.30     5.50
tiny.gguf  4        pp512   6802.40    41.20
tiny.gguf  4        tg128   1290.10    9.90
tiny.gguf  8        pp512   12210.60   88.70
tiny.gguf  8        tg128   1804.50    15.30
)txt";

}  // namespace

std::vector<std::string_view> builtin_corpus_code() { return {kCpp, kPython, kData, kCpp2, kPython2, kShell, kMisc, kCpp3, kPython3, kWeb, kCpp4, kPython4, kLogs}; }

}  // namespace duet
