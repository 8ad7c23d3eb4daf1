// The config tests' shared helpers: a config from JSON text, and the UserError checks.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "model/check.h"
#include "trainer/config.h"

namespace gtron::testing {

inline Config from_text(const std::string& text, const std::vector<std::string>& sets = {}) {
  return config_from_json_text(text, sets, "test.json");
}

// Expects fn to throw a UserError whose message starts "config error: " and holds every piece
// (the key path or file name, and the bad value).
inline void expect_user_error(const std::function<void()>& fn,
                              const std::vector<std::string>& pieces) {
  try {
    fn();
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("config error: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("Hint: "), std::string::npos) << msg;
    for (const std::string& p : pieces) {
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
    }
    return;
  }
  ADD_FAILURE() << "expected a UserError holding '" << pieces.front() << "'";
}

inline void expect_text_error(const std::string& text, const std::vector<std::string>& pieces,
                              const std::vector<std::string>& sets = {}) {
  SCOPED_TRACE(text);
  expect_user_error([&] { from_text(text, sets); }, pieces);
}

}  // namespace gtron::testing
