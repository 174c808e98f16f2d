// Two kinds of errors (see README "Errors"):
//  - DT_CHECK*: a broken invariant inside dtrain. Throws InternalError with file:line and, for the
//    comparison forms, both values. Reaches main() as exit code 1.
//  - UserError: bad input a user can fix (CLI, config, data, checkpoint). Reaches main() as a
//    one-line message and exit code 2.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dtrain {

// The message is printed as one C string: control characters a user's input put into it (a NUL
// from a YAML "\0" escape, which would end the message there; an escape sequence) are shown as
// \0 or \xNN. Newlines and tabs stay: messages may list items on their own lines.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(printable(what)) {}

 private:
  static std::string printable(const std::string& s);
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const std::string& msg);

template <typename A, typename B>
[[noreturn]] void check_op_failed(const char* file, int line, const char* expr, const A& a,
                                  const B& b) {
  std::ostringstream os;
  os << "check failed: " << expr << " (" << a << " vs " << b << ")";
  check_failed(file, line, os.str());
}
}  // namespace detail

}  // namespace dtrain

#define DT_CHECK(cond)                                                                       \
  do {                                                                                       \
    if (!(cond)) ::dtrain::detail::check_failed(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define DT_CHECK_MSG(cond, msg)                                         \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::ostringstream dt_os_;                                        \
      dt_os_ << "check failed: " #cond ": " << msg;                     \
      ::dtrain::detail::check_failed(__FILE__, __LINE__, dt_os_.str()); \
    }                                                                   \
  } while (0)

#define DT_CHECK_OP_(a, b, op)                                                                \
  do {                                                                                        \
    const auto& dt_a_ = (a);                                                                  \
    const auto& dt_b_ = (b);                                                                  \
    if (!(dt_a_ op dt_b_))                                                                    \
      ::dtrain::detail::check_op_failed(__FILE__, __LINE__, #a " " #op " " #b, dt_a_, dt_b_); \
  } while (0)

#define DT_CHECK_EQ(a, b) DT_CHECK_OP_(a, b, ==)
#define DT_CHECK_NE(a, b) DT_CHECK_OP_(a, b, !=)
#define DT_CHECK_LT(a, b) DT_CHECK_OP_(a, b, <)
#define DT_CHECK_LE(a, b) DT_CHECK_OP_(a, b, <=)
#define DT_CHECK_GT(a, b) DT_CHECK_OP_(a, b, >)
#define DT_CHECK_GE(a, b) DT_CHECK_OP_(a, b, >=)
