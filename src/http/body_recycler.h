// Private to the http module.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace flotilla::http {

// Body strings kept with their capacity on each thread. A body read by a parser is handed on
// (to the handler, or in a proxy to the other side) and written out; the writer gives its
// string back here and the next parse on that thread takes it, so a proxied body costs no heap
// allocation once warm. A string that never comes back (a handler kept it) costs what it always
// did: a fresh one.
class BodyRecycler {
 public:
  // An empty string, with capacity when one was given back on this thread.
  static std::string take() {
    auto& kept = strings();
    if (kept.empty()) {
      return {};
    }
    std::string body = std::move(kept.back());
    kept.pop_back();
    return body;
  }

  // Keeps `body`'s buffer for a later take() on this thread; small and huge ones are dropped.
  static void give(std::string&& body) {
    auto& kept = strings();
    if (body.capacity() <= kSmallString || body.capacity() > kMaxBytes || kept.size() >= kKeep) {
      return;
    }
    body.clear();
    kept.push_back(std::move(body));
  }

 private:
  static constexpr size_t kSmallString = 15;  // held in the string itself: nothing to recycle
  static constexpr size_t kMaxBytes = 64 * 1024;
  static constexpr size_t kKeep = 64;

  static std::vector<std::string>& strings() {
    thread_local std::vector<std::string> kept = [] {
      std::vector<std::string> empty;
      empty.reserve(kKeep);
      return empty;
    }();
    return kept;
  }
};

}  // namespace flotilla::http
