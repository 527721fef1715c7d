#include "duet/core/ordered_json.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace duet {
namespace {

using OJson = nlohmann::ordered_json;
// The vector under ordered_map: appended to directly, without the map's search for the key.
using Entries = std::vector<std::pair<const std::string, OJson>>;

Entries& entries(OJson& object) { return static_cast<Entries&>(object.get_ref<OJson::object_t&>()); }

// A repeated key (JSON allows them) as nlohmann treats it: the first place, the last value.
void merge_repeated_keys(OJson& object) {
  Entries& e = entries(object);
  if (e.size() < 2) return;
  std::unordered_map<std::string_view, size_t> first;
  first.reserve(e.size());
  std::vector<bool> repeated(e.size(), false);
  bool any = false;
  for (size_t i = 0; i < e.size(); ++i) {
    const auto [it, inserted] = first.emplace(e[i].first, i);
    if (inserted) continue;
    e[it->second].second = std::move(e[i].second);
    repeated[i] = any = true;
  }
  if (!any) return;
  Entries kept;
  kept.reserve(first.size());
  for (size_t i = 0; i < e.size(); ++i) {
    if (!repeated[i]) kept.emplace_back(e[i].first, std::move(e[i].second));
  }
  e.clear();
  for (auto& [key, value] : kept) e.emplace_back(key, std::move(value));
}

// nlohmann's SAX interface, building the value as its DOM parser does except for the keys.
class OrderedBuilder {
 public:
  explicit OrderedBuilder(OJson& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(OJson::number_integer_t v) { return put(v); }
  bool number_unsigned(OJson::number_unsigned_t v) { return put(v); }
  bool number_float(OJson::number_float_t v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(OJson::binary_t& v) { return put(OJson::binary(std::move(v))); }
  bool start_object(std::size_t) {
    open_.push_back(place(OJson::object()));
    return true;
  }
  bool key(std::string& k) {
    Entries& e = entries(*open_.back());
    e.emplace_back(std::move(k), nullptr);
    slot_ = &e.back().second;
    return true;
  }
  bool end_object() {
    merge_repeated_keys(*open_.back());
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    open_.push_back(place(OJson::array()));
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  // Where the next value goes: the root, the end of the open array, or the key just read. The
  // pointers stay valid: a container gets no new element while one of its elements is open.
  OJson* place(OJson v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    if (open_.back()->is_array()) {
      auto& a = open_.back()->get_ref<OJson::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  template <typename T>
  bool put(T&& v) {
    place(OJson(std::forward<T>(v)));
    return true;
  }

  OJson& root_;
  std::vector<OJson*> open_;
  OJson* slot_ = nullptr;
};

}  // namespace

OJson parse_ordered_json(std::string_view text) {
  OJson root;
  OrderedBuilder builder(root);
  OJson::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

OJson to_ordered_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      OJson out = OJson::object();
      Entries& e = entries(out);
      e.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) e.emplace_back(it.key(), to_ordered_json(it.value()));
      return out;
    }
    case nlohmann::json::value_t::array: {
      OJson out = OJson::array();
      auto& a = out.get_ref<OJson::array_t&>();
      a.reserve(j.size());
      for (const auto& item : j) a.push_back(to_ordered_json(item));
      return out;
    }
    case nlohmann::json::value_t::null: return nullptr;
    case nlohmann::json::value_t::boolean: return j.get<bool>();
    case nlohmann::json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: return j.get<uint64_t>();
    case nlohmann::json::value_t::number_float: return j.get<double>();
    case nlohmann::json::value_t::string: return j.get_ref<const std::string&>();
    case nlohmann::json::value_t::binary: return OJson::binary(j.get_binary());
    case nlohmann::json::value_t::discarded: break;
  }
  return OJson(OJson::value_t::discarded);
}

}  // namespace duet
