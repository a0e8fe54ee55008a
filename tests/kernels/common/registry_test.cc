// SelectImpl / Dispatch (kernels/common/registry.h): the first implementation that supports a
// call and prefers it; a call every supporting implementation passes over goes to the first of
// them; refusals are named when none supports it (docs/CONTRACTS.md "Dispatch").
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/registry.h"

namespace attnd::kernels {
namespace {

struct Call {
  int size = 0;
};

Impl<Call> Make(const std::string& name, int max_size, int min_preferred) {
  Impl<Call> impl(
      name, Backend::kCpu,
      [max_size](const Call& c, std::string* why) {
        if (c.size <= max_size) return true;
        *why = "size past " + std::to_string(max_size);
        return false;
      },
      [](const Call&, const ExecContext&) { return absl::OkStatus(); });
  if (min_preferred > 0) {
    impl.prefer = [min_preferred](const Call& c, std::string* why) {
      if (c.size >= min_preferred) return true;
      *why = "small";
      return false;
    };
  }
  return impl;
}

std::string Selected(const std::vector<Impl<Call>>& impls, int size, std::string* why) {
  ExecContext ctx;
  ctx.backend = Backend::kCpu;
  const Impl<Call>* impl = SelectImpl(impls, Call{size}, ctx, why);
  return impl == nullptr ? "none" : impl->name;
}

TEST(SelectImpl, PreferencePassesOverToTheNextThatSupports) {
  // "big" runs sizes to 100 and is preferred from 50; "small" runs sizes to 60.
  const std::vector<Impl<Call>> impls = {Make("big", 100, 50), Make("small", 60, 0)};
  std::string why;
  EXPECT_EQ(Selected(impls, 10, &why), "small");
  EXPECT_EQ(Selected(impls, 55, &why), "big");
  EXPECT_EQ(Selected(impls, 80, &why), "big");
  why.clear();
  EXPECT_EQ(Selected(impls, 200, &why), "none");
  EXPECT_NE(why.find("big: size past 100"), std::string::npos) << why;
  EXPECT_NE(why.find("small: size past 60"), std::string::npos) << why;
}

TEST(SelectImpl, PassedOverIsChosenWhenNothingLaterSupportsTheCall) {
  // Both pass over size 5; the first passed over runs it, not a later refusal.
  const std::vector<Impl<Call>> impls = {Make("a", 100, 50), Make("b", 100, 20), Make("c", 3, 0)};
  std::string why;
  EXPECT_EQ(Selected(impls, 5, &why), "a");
  EXPECT_EQ(Selected(impls, 30, &why), "b");
  EXPECT_EQ(Selected(impls, 2, &why), "c");
}

TEST(Dispatch, NamesTheImplementationItRan) {
  const std::vector<Impl<Call>> impls = {Make("big", 100, 50), Make("small", 60, 0)};
  ExecContext ctx;
  ctx.backend = Backend::kCpu;
  std::string name;
  ASSERT_TRUE(Dispatch(impls, Call{7}, ctx, &name).ok());
  EXPECT_EQ(name, "small");
  EXPECT_EQ(Dispatch(impls, Call{700}, ctx, &name).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace attnd::kernels
