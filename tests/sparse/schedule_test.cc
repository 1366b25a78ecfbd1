// Sparsity schedules: the documented formulas at chosen steps, custom registration, and the dense
// warm-up (steps and layers) composing with every schedule.
#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tessel/sparse/schedule.h"

namespace tessel {
namespace {

double at(const std::string& schedule, int64_t step, int64_t total, double topk = 0.5) {
  SparseAttnConfig c;
  c.schedule = schedule;
  c.selection.topk_ratio = topk;
  return step_density(c, step, total, 0);
}

TEST(Schedule, ProgressRunsFromZeroToOne) {
  EXPECT_DOUBLE_EQ(schedule_progress(0, 11), 0.0);
  EXPECT_DOUBLE_EQ(schedule_progress(5, 11), 0.5);
  EXPECT_DOUBLE_EQ(schedule_progress(10, 11), 1.0);
  EXPECT_DOUBLE_EQ(schedule_progress(0, 1), 0.0);
  EXPECT_THROW(schedule_progress(11, 11), Error);
  EXPECT_THROW(schedule_progress(-1, 11), Error);
  EXPECT_THROW(schedule_progress(0, 0), Error);
}

TEST(Schedule, ConstantIsTheTopkRatio) {
  for (int64_t step : {0, 7, 49}) EXPECT_DOUBLE_EQ(at("constant", step, 50, 0.3), 0.3);
}

TEST(Schedule, ConservativeIsDenseThenRampsTo0_3) {
  // total 11: progress = step / 10.
  EXPECT_DOUBLE_EQ(at("conservative", 0, 11), 1.0);
  EXPECT_DOUBLE_EQ(at("conservative", 1, 11), 1.0);             // p = 0.1 < 0.2
  EXPECT_DOUBLE_EQ(at("conservative", 2, 11), 1.0);             // p = 0.2: ramp starts at 1
  EXPECT_NEAR(at("conservative", 6, 11), 1.0 - 0.7 * 0.5, 1e-12);  // p = 0.6
  EXPECT_NEAR(at("conservative", 10, 11), 0.3, 1e-12);          // p = 1
}

TEST(Schedule, AggressiveRisesFrom0_2To0_5) {
  EXPECT_NEAR(at("aggressive", 0, 11), 0.2, 1e-12);
  EXPECT_NEAR(at("aggressive", 5, 11), 0.35, 1e-12);
  EXPECT_NEAR(at("aggressive", 10, 11), 0.5, 1e-12);
  EXPECT_NEAR(at("aggressive", 0, 1), 0.2, 1e-12);
}

TEST(Schedule, DenseWarmupComposesWithEverySchedule) {
  for (const std::string name : {"constant", "conservative", "aggressive"}) {
    SparseAttnConfig c;
    c.schedule = name;
    c.warmup.dense_steps = 3;
    c.warmup.dense_layers = 2;
    SCOPED_TRACE(name);
    EXPECT_DOUBLE_EQ(step_density(c, 0, 20, 5), 1.0);  // warm-up step
    EXPECT_DOUBLE_EQ(step_density(c, 2, 20, 5), 1.0);
    EXPECT_DOUBLE_EQ(step_density(c, 19, 20, 0), 1.0);  // warm-up layer
    EXPECT_DOUBLE_EQ(step_density(c, 19, 20, 1), 1.0);
    EXPECT_DOUBLE_EQ(step_density(c, 19, 20, 2), at(name, 19, 20));  // after warm-up: the schedule
    EXPECT_DOUBLE_EQ(step_density(c, 10, 20, 3), at(name, 10, 20));
  }
}

TEST(Schedule, CustomSchedulesRegisterAndAreValidated) {
  register_sparsity_schedule("halving_test", [](int64_t step, int64_t, double topk) { return topk / (1 << step); });
  EXPECT_TRUE(has_sparsity_schedule("halving_test"));
  EXPECT_DOUBLE_EQ(at("halving_test", 2, 5, 0.8), 0.2);
  SparseAttnConfig c;
  c.schedule = "halving_test";
  EXPECT_NO_THROW(c.validate());

  register_sparsity_schedule("broken_test", [](int64_t, int64_t, double) { return 1.5; });
  try {
    at("broken_test", 0, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("schedule 'broken_test'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(register_sparsity_schedule("constant", [](int64_t, int64_t, double) { return 1.0; }), Error);
  EXPECT_THROW(register_sparsity_schedule("", [](int64_t, int64_t, double) { return 1.0; }), Error);
  EXPECT_THROW(register_sparsity_schedule("empty_fn", SparsitySchedule{}), Error);
  EXPECT_THROW(get_sparsity_schedule("nonexistent"), Error);
}

}  // namespace
}  // namespace tessel
