// model/env.h: the GTRON_* switches take exactly their values; anything else is a UserError that
// names the variable and lists what it takes; unset and empty give the default.
#include "model/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "model/check.h"

namespace gtron {
namespace {

constexpr const char* kVar = "GTRON_ENV_TEST_SWITCH";

TEST(Env, FlagTakesZeroAndOneAndDefaultsWhenUnsetOrEmpty) {
  unsetenv(kVar);
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_FALSE(env_flag(kVar, false));
  EXPECT_EQ(env_value(kVar), nullptr);
  setenv(kVar, "", 1);
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_EQ(env_value(kVar), nullptr);
  setenv(kVar, "1", 1);
  EXPECT_TRUE(env_flag(kVar, false));
  setenv(kVar, "0", 1);
  EXPECT_FALSE(env_flag(kVar, true));
  unsetenv(kVar);
}

TEST(Env, FlagRefusesOtherValuesNamingTheVariable) {
  for (const char* bad : {"yes", "true", "2", " 1"}) {
    setenv(kVar, bad, 1);
    try {
      env_flag(kVar, false);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(kVar), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("\"") + bad + "\""), std::string::npos) << what;
      EXPECT_NE(what.find("0, 1"), std::string::npos) << what;
    }
  }
  unsetenv(kVar);
}

TEST(Env, ChoiceGivesTheIndexOrTheDefaultAndListsTheChoices) {
  const std::vector<std::string> modes = {"hoist", "keep", "kernels"};
  unsetenv(kVar);
  EXPECT_EQ(env_choice(kVar, modes, 2), 2);
  setenv(kVar, "keep", 1);
  EXPECT_EQ(env_choice(kVar, modes, 0), 1);
  setenv(kVar, "Keep", 1);
  try {
    env_choice(kVar, modes, 0);
    ADD_FAILURE() << "accepted Keep";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("hoist, keep, kernels"), std::string::npos) << e.what();
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace gtron
