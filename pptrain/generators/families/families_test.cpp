#include "pptrain/generators/families/families.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

// The message check_family_options() gives, or "" when it accepts the values.
std::string refusal(const FamilyValues& given, const std::string& schedule) {
  try {
    check_family_options(given, schedule);
    return "";
  } catch (const UserError& e) {
    return e.what();
  }
}

TEST(Families, EveryEntrysRuleIsFoundByItsName) {
  for (const ScheduleEntry& entry : schedule_registry()) {
    EXPECT_EQ(&find_weight_rule(entry.update->name()), entry.update) << entry.name;
    for (const WeightRule* rule : entry.other_rules) {
      EXPECT_EQ(&find_weight_rule(rule->name()), rule) << entry.name;
    }
  }
  EXPECT_FALSE(find_weight_rule("flush").asynchronous());
  EXPECT_THROW(find_weight_rule("nonesuch"), UserError);
}

TEST(Families, OptionsAreFlagsListedOnce) {
  std::set<std::string> flags;
  for (const FamilyOption* option : family_options()) {
    EXPECT_EQ(option->flag.rfind("--", 0), 0u) << option->flag;
    EXPECT_TRUE(flags.insert(option->flag).second) << option->flag;
    EXPECT_FALSE(option->help.empty()) << option->flag;
  }
  EXPECT_TRUE(flags.count("--update-interval"));
  EXPECT_TRUE(flags.count("--pipemare-decay"));
}

TEST(Families, AnOptionAppliesToItsFamilyOnlyAndInItsRange) {
  EXPECT_EQ(refusal({{"--update-interval", 2}}, "ampnet"), "");
  EXPECT_EQ(refusal({{"--no-lr-reschedule", true}, {"--pipemare-decay", 0.5}}, "pipemare"), "");
  EXPECT_EQ(refusal({{"--update-interval", 2}}, "pipemare"),
            "--update-interval applies to --schedule ampnet only, not 'pipemare'");
  EXPECT_EQ(refusal({{"--avg-interval", 2}}, ""),
            "--avg-interval applies to --schedule avgpipe only, not 'a schedule file'");
  EXPECT_EQ(refusal({{"--update-interval", 0}}, "ampnet"), "--update-interval must be >= 1, got 0");
  EXPECT_EQ(refusal({{"--pipemare-decay", 1.0}}, "pipemare"),
            "--pipemare-decay must be in [0, 1), got 1");
  EXPECT_EQ(refusal({{"--pipemare-warmup", -1}}, "pipemare"),
            "--pipemare-warmup must be >= 0, got -1");
}

TEST(Families, AnOptionSetsTheRuleItConfigures) {
  const VersionRule plain = version_rule_of("ampnet", 4, 8);
  const VersionRule every3 = version_rule_of("ampnet", 4, 8, {{"--update-interval", 3}});
  EXPECT_EQ(plain.period(), 1);
  EXPECT_EQ(every3.period(), 3);
  EXPECT_EQ(family_int({}, "--update-interval", 7), 7);
  EXPECT_TRUE(family_switch({{"--no-lr-reschedule", true}}, "--no-lr-reschedule"));
}

}  // namespace
}  // namespace pptrain
