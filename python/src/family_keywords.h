// The schedule families' options as Python keywords, shared by both extensions (`_plan` and
// `_runtime`): the one conversion of a `**family` dict into the registry's FamilyValues.
//
//   request.family = family_values_of(family);   // {"vertical_sync": True} -> --vertical-sync
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/keywords.h"
#include "pptrain/generators/registry.h"

namespace pptrain::python {

// The schedule family's options from Python's keywords (the `**family` of pptrain.schedule and
// pptrain.plan.schedule): each the keyword of a `pptrain train` flag (keyword_of:
// `pipemare_warmup=50`), of the flag's kind; their ranges and families are checked with the
// schedule (version_rule_of).
inline FamilyValues family_values_of(const pybind11::dict& given) {
  namespace py = pybind11;
  FamilyValues out;
  const std::vector<const FamilyOption*> options = family_options();
  for (const auto& [key, value] : given) {
    const std::string keyword = py::str(key);
    const auto option = std::find_if(options.begin(), options.end(), [&](const FamilyOption* o) {
      return keyword_of(o->flag) == keyword;
    });
    if (option == options.end()) {
      std::string names;
      for (const FamilyOption* o : options) {
        names += (names.empty() ? "" : ", ") + keyword_of(o->flag);
      }
      throw UserError("schedule: unknown keyword '" + keyword + "' (the families' options are " +
                      names + ")");
    }
    const FamilyOption::Kind kind = (*option)->kind;
    const bool is_bool = py::isinstance<py::bool_>(value);
    const bool fits =
        kind == FamilyOption::Kind::kSwitch ? is_bool
        : kind == FamilyOption::Kind::kInt
            ? py::isinstance<py::int_>(value) && !is_bool
            : (py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)) && !is_bool;
    PPTRAIN_CHECK(fits, "schedule: ", keyword, " must be ",
                  kind == FamilyOption::Kind::kSwitch ? "True or False"
                  : kind == FamilyOption::Kind::kInt  ? "a whole number"
                                                      : "a number",
                  ", got ", std::string(py::repr(value)));
    const std::string& flag = (*option)->flag;
    if (kind == FamilyOption::Kind::kSwitch) {
      out[flag] = value.cast<bool>();
    } else if (kind == FamilyOption::Kind::kInt) {
      out[flag] = value.cast<int>();
    } else {
      out[flag] = value.cast<double>();
    }
  }
  return out;
}

}  // namespace pptrain::python
