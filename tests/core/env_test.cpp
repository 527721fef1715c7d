#include "duet/core/env.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "duet/core/error.h"

namespace duet {
namespace {

// Unset or empty: the first choice; a choice: its index; anything else: an error naming the
// variable, the value and every choice.
TEST(Env, ChoiceOfASetting) {
  const char* name = "DUET_ENV_TEST_SETTING";
  ::unsetenv(name);
  EXPECT_EQ(env_choice(name, {"auto", "absorbed", "off"}), 0u);
  ::setenv(name, "", 1);
  EXPECT_EQ(env_choice(name, {"auto", "absorbed", "off"}), 0u);
  ::setenv(name, "off", 1);
  EXPECT_EQ(env_choice(name, {"auto", "absorbed", "off"}), 2u);
  ::setenv(name, "absorbed", 1);
  EXPECT_EQ(env_choice(name, {"auto", "absorbed", "off"}), 1u);
  ::setenv(name, "Absorbed", 1);
  try {
    env_choice(name, {"auto", "absorbed", "off"});
    FAIL() << "no error for 'Absorbed'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("DUET_ENV_TEST_SETTING is 'Absorbed', expected auto, absorbed or off"),
              std::string::npos)
        << e.what();
  }
  ::setenv(name, "fp8", 1);
  EXPECT_EQ(env_choice(name, {"f32", "fp8"}), 1u);
  ::unsetenv(name);
}

}  // namespace
}  // namespace duet
