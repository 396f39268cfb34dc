// Integer arrays from Python, for the extensions of the `ferry` package (ferry._ferry's ids,
// ferry._data's example indices): a numpy array of any integer dtype (any width, signed or
// unsigned), or anything np.asarray makes one of, given to C++ as C-contiguous int64 (used in
// place when it is that already, else converted once).
//
// Anything else raises TypeError naming the argument and its dtype: a float id would be truncated
// (1.7 becomes 1), and a float64 above 2^53 has lost digits before it gets here; bool and object
// arrays are refused too. Negative values are ids like any other (ids are int64). An unsigned
// value above INT64_MAX has no int64 and raises OverflowError (view a uint64 array as int64 to
// send its bits). An empty Python sequence ([], which np.asarray makes float64) is an empty array
// of ids; an empty numpy array must still have an integer dtype.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>

namespace ferry::python {

using Int64Array = pybind11::array_t<int64_t, pybind11::array::c_style | pybind11::array::forcecast>;

// `what` names the argument in errors ("pull_sparse: ids").
inline Int64Array IntegerArray(const pybind11::handle& obj, const std::string& what) {
  namespace py = pybind11;
  const bool was_array = py::isinstance<py::array>(obj);
  py::array a = py::array::ensure(obj);
  if (!a) throw py::type_error(what + " must be an array of integers, not " + std::string(py::str(py::type::of(obj))));
  const char kind = a.dtype().kind();
  const bool empty_sequence = !was_array && a.size() == 0;
  if (kind != 'i' && kind != 'u' && !empty_sequence) {
    throw py::type_error(
        what + " must be an array of integers (any width and sign), not " + std::string(py::str(a.dtype())) +
        (kind == 'f' ? " (float ids would be truncated; convert them with astype if they are whole)" : ""));
  }
  if (kind == 'u' && a.itemsize() == 8) {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!u) throw py::type_error(what + ": cannot read " + std::string(py::str(a.dtype())) + " as uint64");
    for (const uint64_t x : std::span<const uint64_t>(u.data(), static_cast<size_t>(u.size()))) {
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        const std::string text = what + ": " + std::to_string(x) +
                                 " is above the largest int64 id (view a uint64 array as int64 to send its bits)";
        PyErr_SetString(PyExc_OverflowError, text.c_str());
        throw py::error_already_set();
      }
    }
  }
  Int64Array out = Int64Array::ensure(a);
  if (!out) throw py::type_error(what + ": cannot convert " + std::string(py::str(a.dtype())) + " to int64");
  return out;
}

}  // namespace ferry::python
