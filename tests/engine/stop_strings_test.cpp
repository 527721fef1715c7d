#include "duet/engine/stop_strings.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/random.h"

namespace duet {
namespace {

struct Fed {
  std::vector<std::string> emitted;  // per push, then the flush
  std::string text;                  // all of it
  bool stopped = false;
  std::string matched;
};

Fed feed(StopStringMatcher& m, const std::vector<std::string>& pieces, bool flush = true) {
  Fed run;
  for (const std::string& piece : pieces) {
    StopStringMatcher::Result r = m.push(piece);
    run.emitted.push_back(r.text);
    run.text += r.text;
    if (r.stopped) {
      EXPECT_FALSE(run.stopped) << "stopped twice";
      run.stopped = true;
      run.matched = r.matched;
    }
  }
  if (flush) {
    run.emitted.push_back(m.flush());
    run.text += run.emitted.back();
  }
  return run;
}

Fed feed(const std::vector<std::string>& stops, bool include, const std::vector<std::string>& pieces) {
  StopStringMatcher m(stops, include);
  return feed(m, pieces);
}

// Whole-text reference: the occurrence that ends first wins; at the same end, the one that
// starts first.
struct Expected {
  std::string text;
  bool stopped = false;
  std::string matched;
};

Expected reference(const std::vector<std::string>& stops, bool include, const std::string& text) {
  size_t best_end = std::string::npos, best_pos = std::string::npos;
  std::string matched;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t pos = text.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_end = end;
      best_pos = pos;
      matched = s;
    }
  }
  if (best_end == std::string::npos) return {text, false, ""};
  return {text.substr(0, include ? best_end : best_pos), true, matched};
}

// Splits s into pieces at the given byte offsets.
std::vector<std::string> split_at(const std::string& s, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> out;
  size_t prev = 0;
  for (size_t c : cuts) {
    out.push_back(s.substr(prev, c - prev));
    prev = c;
  }
  out.push_back(s.substr(prev));
  return out;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

TEST(StopStrings, FoundInOnePush) {
  const Fed r = feed({"STOP"}, false, {"Hello STOP world"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "STOP");
  EXPECT_EQ(r.text, "Hello ");
}

TEST(StopStrings, SplitAcrossTwoAndThreePushes) {
  Fed r = feed({"STOP"}, false, {"Hello ST", "OP world"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emitted[0], "Hello ");  // "ST" held back
  EXPECT_EQ(r.emitted[1], "");
  EXPECT_EQ(r.text, "Hello ");

  r = feed({"STOP"}, false, {"Hello S", "T", "OP and more"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emitted[0], "Hello ");
  EXPECT_EQ(r.emitted[1], "");
  EXPECT_EQ(r.text, "Hello ");

  r = feed({"</answer>"}, true, {"x = 4</an", "sw", "er>\nignored"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "x = 4</answer>");
}

TEST(StopStrings, NothingAfterTheStopIsEverEmitted) {
  StopStringMatcher m({"END"}, false);
  EXPECT_EQ(m.push("abcE").text, "abc");
  const auto r = m.push("NDxyz");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more text").text, "");
  EXPECT_FALSE(m.push("END").stopped);  // reported once
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, IncludeStop) {
  Fed r = feed({"STOP"}, true, {"Hello STOP world"});
  EXPECT_EQ(r.text, "Hello STOP");
  r = feed({"STOP"}, true, {"Hel", "lo S", "TO", "P", " world"});
  EXPECT_EQ(r.text, "Hello STOP");
  EXPECT_EQ(r.matched, "STOP");
}

TEST(StopStrings, EarliestStopWins) {
  Fed r = feed({"world", "lo"}, false, {"Hello world"});
  EXPECT_EQ(r.text, "Hel");
  EXPECT_EQ(r.matched, "lo");
  r = feed({"lo", "world"}, false, {"Hello world"});
  EXPECT_EQ(r.text, "Hel");
  r = feed({"world", "d!"}, false, {"Hello world!"});
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(r.matched, "world");
}

TEST(StopStrings, OverlappingStops) {
  // Ending at the same byte: the one that starts first.
  Fed r = feed({"bc", "abc"}, true, {"xabcx"});
  EXPECT_EQ(r.matched, "abc");
  EXPECT_EQ(r.text, "xabc");
  r = feed({"bc", "abc"}, false, {"xab", "cx"});
  EXPECT_EQ(r.matched, "abc");
  EXPECT_EQ(r.text, "x");
  // "y" is complete before "xyz" could be: it wins however the text is cut.
  for (const auto& pieces : std::vector<std::vector<std::string>>{{"xyz"}, {"x", "y", "z"}, {"xy", "z"}}) {
    r = feed({"xyz", "y"}, false, pieces);
    EXPECT_EQ(r.matched, "y");
    EXPECT_EQ(r.text, "x");
  }
}

TEST(StopStrings, StopThatIsAPrefixOfAnother) {
  Fed r = feed({"abc", "ab"}, false, {"zabcd"});
  EXPECT_EQ(r.matched, "ab");
  EXPECT_EQ(r.text, "z");
  r = feed({"ab", "abc"}, true, {"za", "bcd"});
  EXPECT_EQ(r.emitted[0], "z");
  EXPECT_EQ(r.matched, "ab");
  EXPECT_EQ(r.text, "zab");
}

TEST(StopStrings, HeldBackTextIsReleasedWhenItCannotMatch) {
  StopStringMatcher m({"STOP"}, false);
  EXPECT_EQ(m.push("hello").text, "hello");  // nothing that can start a stop string
  EXPECT_EQ(m.num_pending(), 0u);
  EXPECT_EQ(m.push("TOP").text, "TOP");  // the middle of a stop string cannot start one
  EXPECT_EQ(m.push("xS").text, "x");
  EXPECT_EQ(m.num_pending(), 1u);
  EXPECT_EQ(m.push("T").text, "");
  EXPECT_EQ(m.push("a").text, "STa");
  EXPECT_EQ(m.num_pending(), 0u);
  EXPECT_EQ(m.push("xSTO").text, "x");
  EXPECT_EQ(m.num_pending(), 3u);  // at most the longest stop string - 1
  EXPECT_EQ(m.push("STOP").text, "STO");  // "STOS" cannot match, "STOP" after it does
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, PartialOverlapRestarts) {
  // "aa" may still become "aab" although "aaa" did not.
  StopStringMatcher m({"aab"}, false);
  EXPECT_EQ(m.push("aaa").text, "a");
  const auto r = m.push("b");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopStrings, Flush) {
  StopStringMatcher m({"STOP"}, false);
  EXPECT_EQ(m.push("abS").text, "ab");
  EXPECT_EQ(m.push("TO").text, "");
  EXPECT_EQ(m.flush(), "STO");
  EXPECT_EQ(m.num_pending(), 0u);
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, NoStopStringsPassThrough) {
  StopStringMatcher m({}, false);
  EXPECT_EQ(m.push("anything at all").text, "anything at all");
  StopStringMatcher e({"", ""}, true);  // empty stop strings are ignored
  EXPECT_EQ(e.push("abc").text, "abc");
  EXPECT_FALSE(e.stopped());
}

TEST(StopStrings, MultiByteCharactersAreNeverSplit) {
  // A stop string of multi-byte characters, split across pushes.
  Fed r = feed({"世界"}, false, {"你好世", "界!"});
  EXPECT_EQ(r.emitted[0], "你好");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "你好");
  // Text cut inside a character: the incomplete character waits for the rest of it.
  StopStringMatcher m({"世界"}, false);
  const std::string ni = "你";  // E4 BD A0
  EXPECT_EQ(m.push(ni.substr(0, 2)).text, "");
  EXPECT_EQ(m.push(ni.substr(2) + "好").text, "你好");
  // Bytes shared with the start of a stop string: 丁 = E4 B8 81, 世 = E4 B8 96.
  const std::string ding = "丁";
  EXPECT_EQ(m.push(ding.substr(0, 2)).text, "");
  EXPECT_EQ(m.push(ding.substr(2)).text, "丁");
  EXPECT_EQ(m.flush(), "");
  // A flush at the end still returns an incomplete tail as it is.
  StopStringMatcher tail({"x"}, false);
  EXPECT_EQ(tail.push("é" + ni.substr(0, 1)).text, "é");
  EXPECT_EQ(tail.flush(), ni.substr(0, 1));
}

TEST(StopStrings, RandomChunkingsMatchWholeTextReference) {
  const std::vector<std::vector<std::string>> stop_sets = {
      {"ab"}, {"abcab", "bca"}, {"ccc", "ab", "cab"}, {"aab", "abb", "b"}, {"abcabc"}, {"cba", "a"}};
  const char alphabet[] = "abc";
  Rng rng(2024);
  int stopped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const auto& stops = stop_sets[trial % stop_sets.size()];
    const bool include = (trial / 7) % 2 == 0;
    std::string text;
    const size_t len = 1 + static_cast<size_t>(rng.uniform() * 24);
    for (size_t i = 0; i < len; ++i) text += alphabet[static_cast<size_t>(rng.uniform() * 3)];
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng.uniform() < 0.4) cuts.push_back(i);
    }
    const auto pieces = split_at(text, cuts);
    const Expected want = reference(stops, include, text);
    StopStringMatcher m(stops, include);
    size_t max_len = 0;
    for (const auto& s : stops) max_len = std::max(max_len, s.size());
    std::string emitted;
    for (const auto& piece : pieces) {
      const auto r = m.push(piece);
      emitted += r.text;
      // Emitted text is always a prefix of what the whole text allows.
      ASSERT_EQ(want.text.compare(0, emitted.size(), emitted), 0) << text << " emitted " << emitted;
      ASSERT_LE(m.num_pending(), max_len - 1);
    }
    emitted += m.flush();
    ASSERT_EQ(emitted, want.text) << "text " << text << " include " << include;
    ASSERT_EQ(m.stopped(), want.stopped) << text;
    stopped += want.stopped;
  }
  EXPECT_GT(stopped, 500);
}

TEST(StopStrings, RandomUtf8ChunkingsNeverSplitACharacter) {
  const std::vector<std::string> chars = {"a", "b", "é", "ü", "世", "界", "丁", "😀", "😁", " "};
  const std::vector<std::string> stops = {"世界", "😀😁", "é b"};
  Rng rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const size_t len = 1 + static_cast<size_t>(rng.uniform() * 16);
    for (size_t i = 0; i < len; ++i) text += chars[static_cast<size_t>(rng.uniform() * chars.size())];
    std::vector<size_t> cuts;  // byte offsets, inside characters too
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng.uniform() < 0.3) cuts.push_back(i);
    }
    const bool include = trial % 2 == 0;
    StopStringMatcher m(stops, include);
    std::string emitted;
    for (const auto& piece : split_at(text, cuts)) {
      const auto r = m.push(piece);
      ASSERT_TRUE(valid_utf8(r.text)) << "split a character: " << text;
      emitted += r.text;
    }
    const std::string rest = m.flush();
    ASSERT_TRUE(valid_utf8(rest));
    emitted += rest;
    ASSERT_EQ(emitted, reference(stops, include, text).text) << text;
  }
}

}  // namespace
}  // namespace duet
