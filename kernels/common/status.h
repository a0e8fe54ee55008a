// Status helpers shared by every layer: early-return macros and message builders.
//   ATTND_RETURN_IF_ERROR(Validate(p));
//   ATTND_ASSIGN_OR_RETURN(auto x, MakeX());
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define ATTND_STATUS_CONCAT_INNER_(a, b) a##b
#define ATTND_STATUS_CONCAT_(a, b) ATTND_STATUS_CONCAT_INNER_(a, b)

#define ATTND_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status attnd_status_ = (expr);         \
    if (!attnd_status_.ok()) return attnd_status_; \
  } while (false)

#define ATTND_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define ATTND_ASSIGN_OR_RETURN(lhs, expr) \
  ATTND_ASSIGN_OR_RETURN_IMPL_(ATTND_STATUS_CONCAT_(attnd_statusor_, __LINE__), lhs, expr)
