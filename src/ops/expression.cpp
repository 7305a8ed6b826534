// SPDX-License-Identifier: Apache-2.0
// Band math (calc): the expression compiler (see expression.hpp and docs/band-math.md).
//
// Three passes, each linear in the expression's length:
// 1. Parse: a recursive-descent parser (one function per precedence level) builds a node array
//    in which every node comes after its operands (post-order). Left-associative chains are
//    loops, so a long `A + A + ...` costs no stack; only nesting recurses, and the nesting depth
//    is bounded (kCalcMaxDepth). Names are resolved and bands checked as they are read, so
//    every error carries the position of the token that caused it.
// 2. Fold: in array order (operands first), nodes whose operands are all constants become
//    constants, computed by the evaluator's own operations (calc_math.hpp) in the compute type;
//    numpy's `**` fast paths apply (x**2 is x*x, x**0.5 sqrt(x), x**-1 1/x, x**1 x).
// 3. Lower: each expression's tree is emitted as register code, operands needing more registers
//    first (Sethi-Ullman order), so the register count is about log2 of the tree's size; the walk
//    uses an explicit stack, since a left-deep chain is as deep as it is long.
#include "ops/expression.hpp"

#include "common/text_escape.hpp"
#include "ops/calc_math.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vibespatial::raster::detail {

namespace {

using ops::CalcInstr;
using ops::CalcOp;

// ---- Names

struct Function {
  std::string_view name;
  CalcOp op;
  int min_args;
  int max_args;  ///< 0: any number from min_args (min, max)
};

// numpy's spellings beside the short ones (arcsin, power, minimum, ...), muparser's ln.
constexpr Function kFunctions[] = {
    {"abs", CalcOp::abs, 1, 1},
    {"absolute", CalcOp::abs, 1, 1},
    {"fabs", CalcOp::abs, 1, 1},
    {"sqrt", CalcOp::sqrt, 1, 1},
    {"exp", CalcOp::exp, 1, 1},
    {"log", CalcOp::log, 1, 1},
    {"ln", CalcOp::log, 1, 1},
    {"log10", CalcOp::log10, 1, 1},
    {"sin", CalcOp::sin, 1, 1},
    {"cos", CalcOp::cos, 1, 1},
    {"tan", CalcOp::tan, 1, 1},
    {"asin", CalcOp::asin, 1, 1},
    {"arcsin", CalcOp::asin, 1, 1},
    {"acos", CalcOp::acos, 1, 1},
    {"arccos", CalcOp::acos, 1, 1},
    {"atan", CalcOp::atan, 1, 1},
    {"arctan", CalcOp::atan, 1, 1},
    {"atan2", CalcOp::atan2, 2, 2},
    {"arctan2", CalcOp::atan2, 2, 2},
    {"floor", CalcOp::floor, 1, 1},
    {"ceil", CalcOp::ceil, 1, 1},
    {"round", CalcOp::round, 1, 1},
    {"rint", CalcOp::round, 1, 1},
    {"min", CalcOp::min, 2, 0},
    {"minimum", CalcOp::min, 2, 0},
    {"max", CalcOp::max, 2, 0},
    {"maximum", CalcOp::max, 2, 0},
    {"pow", CalcOp::pow, 2, 2},
    {"power", CalcOp::pow, 2, 2},
    {"isnan", CalcOp::isnan, 1, 1},
    {"isinf", CalcOp::isinf, 1, 1},
    {"where", CalcOp::select, 3, 3},
    {"logical_and", CalcOp::logical_and, 2, 2},
    {"logical_or", CalcOp::logical_or, 2, 2},
    {"logical_not", CalcOp::logical_not, 1, 1},
};

struct Constant {
  std::string_view name;
  double value;
};
constexpr Constant kConstants[] = {
    {"inf", std::numeric_limits<double>::infinity()},
    {"nan", std::numeric_limits<double>::quiet_NaN()},
    {"pi", 3.141592653589793238462643},
};

constexpr std::string_view kKeywords[] = {"and", "or", "not"};

const Function* find_function(std::string_view name) {
  for (const Function& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const Constant* find_constant(std::string_view name) {
  for (const Constant& c : kConstants) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

bool is_keyword(std::string_view name) {
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) != std::end(kKeywords);
}

bool is_name_start(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}
bool is_digit(char ch) {
  return ch >= '0' && ch <= '9';
}
bool is_name_char(char ch) {
  return is_name_start(ch) || is_digit(ch);
}

bool is_identifier(std::string_view s) {
  if (s.empty() || !is_name_start(s[0])) return false;
  return std::all_of(s.begin(), s.end(), is_name_char);
}

/// @p s escaped for a message, cut to 40 bytes (with "...") so that a huge token stays readable.
std::string shown(std::string_view s) {
  constexpr std::size_t kMax = 40;
  if (s.size() <= kMax) return printable(s);
  std::size_t end = kMax;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return printable(s.substr(0, end)) + "...";
}

// ---- Error messages

/// Code points in @p s (an invalid byte counts as one).
std::size_t code_points(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++n) {
    char32_t cp = 0;
    const std::size_t len = utf8_sequence(s, i, cp);
    i += len == 0 ? 1 : len;
  }
  return n;
}

/// Moves @p i back to the start of the UTF-8 sequence it is inside (at most 3 bytes).
std::size_t sequence_start(std::string_view s, std::size_t i) {
  for (int k = 0;
       k < 3 && i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; ++k)
    --i;
  return i;
}

/// The expression line (escaped; a window around @p pos when long) and a caret under @p pos.
std::string caret_lines(std::string_view text, std::size_t pos) {
  constexpr std::size_t kBefore = 60, kAfter = 40;
  pos = std::min(pos, text.size());
  std::size_t start = pos > kBefore ? sequence_start(text, pos - kBefore) : 0;
  std::size_t end = std::min(text.size(), pos + kAfter);
  end = sequence_start(text, end);
  if (end < pos) end = pos;
  const std::string lead = start > 0 ? "..." : "";
  const std::string line =
      lead + printable(text.substr(start, end - start)) + (end < text.size() ? "..." : "");
  const std::size_t caret = code_points(lead + printable(text.substr(start, pos - start)));
  return "\n  " + line + "\n  " + std::string(caret, ' ') + "^";
}

/// Throws the compiler's error for expression @p index (of @p count) at byte @p pos.
[[noreturn]] void fail_at(const char* who, std::size_t index, std::size_t count,
                          std::string_view text, std::size_t pos, const std::string& what) {
  std::string msg = std::string(who) + ": ";
  if (count > 1) msg += "expression " + std::to_string(index + 1) + ": ";
  msg += what + " at column " + std::to_string(code_points(text.substr(0, pos)) + 1);
  msg += caret_lines(text, pos);
  throw std::invalid_argument(msg);
}

// ---- Parse

/// A node of an expression tree; its operands come before it in the array.
struct Node {
  CalcOp op = CalcOp::constant;
  int a = -1, b = -1, c = -1;
  int slot = 0;               ///< load: index into CalcCompiled::slots
  double value = 0;           ///< constant
  bool pow_operator = false;  ///< pow written as ** or ^: numpy's fast paths apply
  std::size_t pos = 0;        ///< byte offset of its token, for errors
};

enum class Tok {
  end,
  number,
  name,
  lparen,
  rparen,
  lbracket,
  rbracket,
  comma,
  question,
  colon,
  plus,
  minus,
  star,
  slash,
  power,
  lt,
  le,
  gt,
  ge,
  eq,
  ne,
  andand,
  oror,
  bang,
};

struct Token {
  Tok kind = Tok::end;
  std::size_t pos = 0, len = 0;
  double value = 0;
};

/// What the compiler knows about the inputs and the bands read so far.
struct Context {
  const char* who;
  const std::vector<CalcInputBands>& inputs;
  std::map<std::string_view, int> input_index;
  std::map<std::pair<int, int>, int> slot_index;
  std::vector<CalcSlotRef> slots;
  std::vector<Node> nodes;
  std::size_t expression_count = 1;

  int slot(int input, int band) {
    const auto [it, added] = slot_index.emplace(std::make_pair(input, band), 0);
    if (added) {
      it->second = static_cast<int>(slots.size());
      slots.push_back(CalcSlotRef{input, band});
    }
    return it->second;
  }
};

class Parser {
 public:
  Parser(Context& ctx, std::string_view text, std::size_t index)
      : ctx_(ctx), text_(text), index_(index) {}

  /// The root node of the whole expression.
  int parse() {
    advance();
    if (tok_.kind == Tok::end) fail(0, "empty expression");
    const int root = ternary();
    if (tok_.kind == Tok::rparen) fail(tok_.pos, "unmatched ')'");
    if (tok_.kind != Tok::end)
      fail(tok_.pos, "unexpected " + describe(tok_) + " after a complete expression");
    return root;
  }

 private:
  /// One nesting level (parentheses, a call, a unary operator, a branch, an exponent).
  class Level {
   public:
    Level(Parser& p, std::size_t pos) : p_(p) {
      if (++p_.depth_ > kCalcMaxDepth) {
        p_.fail(pos, "expression nested too deeply (more than " + std::to_string(kCalcMaxDepth) +
                         " levels)");
      }
    }
    ~Level() { --p_.depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    Parser& p_;
  };

  [[noreturn]] void fail(std::size_t pos, const std::string& what) const {
    fail_at(ctx_.who, index_, ctx_.expression_count, text_, pos, what);
  }

  std::size_t column(std::size_t pos) const { return code_points(text_.substr(0, pos)) + 1; }

  std::string_view text_of(const Token& t) const { return text_.substr(t.pos, t.len); }

  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Tok::end:
        return "end of the expression";
      case Tok::number:
        return "number '" + shown(text_of(t)) + "'";
      case Tok::name:
        return (is_keyword(text_of(t)) ? "keyword '" : "name '") + shown(text_of(t)) + "'";
      default:
        return "'" + std::string(text_of(t)) + "'";
    }
  }

  bool at_keyword(std::string_view word) const {
    return tok_.kind == Tok::name && text_of(tok_) == word;
  }

  // ---- Lexer

  void advance() {
    std::size_t i = next_;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' ||
                                text_[i] == '\r' || text_[i] == '\f' || text_[i] == '\v'))
      ++i;
    tok_ = Token{};
    tok_.pos = i;
    if (i >= text_.size()) {
      tok_.kind = Tok::end;
      next_ = i;
      return;
    }
    const char ch = text_[i];
    const auto peek = [&](std::size_t k) { return i + k < text_.size() ? text_[i + k] : '\0'; };
    const auto punct = [&](Tok kind, std::size_t len) {
      tok_.kind = kind;
      tok_.len = len;
    };
    if (is_digit(ch) || (ch == '.' && is_digit(peek(1)))) {
      lex_number(i);
    } else if (is_name_start(ch)) {
      std::size_t j = i;
      while (j < text_.size() && is_name_char(text_[j])) ++j;
      tok_.kind = Tok::name;
      tok_.len = j - i;
    } else {
      switch (ch) {
        case '(':
          punct(Tok::lparen, 1);
          break;
        case ')':
          punct(Tok::rparen, 1);
          break;
        case '[':
          punct(Tok::lbracket, 1);
          break;
        case ']':
          punct(Tok::rbracket, 1);
          break;
        case ',':
          punct(Tok::comma, 1);
          break;
        case '?':
          punct(Tok::question, 1);
          break;
        case ':':
          punct(Tok::colon, 1);
          break;
        case '+':
          punct(Tok::plus, 1);
          break;
        case '-':
          punct(Tok::minus, 1);
          break;
        case '*':
          if (peek(1) == '*') {
            punct(Tok::power, 2);
          } else {
            punct(Tok::star, 1);
          }
          break;
        case '/':
          punct(Tok::slash, 1);
          break;
        case '^':
          punct(Tok::power, 1);
          break;
        case '<':
          if (peek(1) == '=') {
            punct(Tok::le, 2);
          } else {
            punct(Tok::lt, 1);
          }
          break;
        case '>':
          if (peek(1) == '=') {
            punct(Tok::ge, 2);
          } else {
            punct(Tok::gt, 1);
          }
          break;
        case '=':
          if (peek(1) != '=') fail(i, "'=' is not an operator: compare with '=='");
          punct(Tok::eq, 2);
          break;
        case '!':
          if (peek(1) == '=') {
            punct(Tok::ne, 2);
          } else {
            punct(Tok::bang, 1);
          }
          break;
        case '&':
          if (peek(1) != '&') {
            fail(i, "'&' (numpy's bitwise and) is not an operator here: write '&&' or 'and'");
          }
          punct(Tok::andand, 2);
          break;
        case '|':
          if (peek(1) != '|') {
            fail(i, "'|' (numpy's bitwise or) is not an operator here: write '||' or 'or'");
          }
          punct(Tok::oror, 2);
          break;
        case '~':
          fail(i, "'~' (numpy's bitwise not) is not an operator here: write '!' or 'not'");
        case '%':
          fail(i, "'%' (remainder) is not an operator here");
        default:
          lex_error(i);
      }
    }
    next_ = i + tok_.len;
  }

  [[noreturn]] void lex_error(std::size_t i) const {
    char32_t cp = 0;
    const std::size_t len = utf8_sequence(text_, i, cp);
    if (len == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(text_[i]));
      fail(i, std::string("invalid UTF-8 byte ") + buf);
    }
    char code[16];
    std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
    fail(i, "unexpected character '" + printable(text_.substr(i, len)) + "' (" + code + ")");
  }

  /// digits [. digits] [(e|E) [+|-] digits], or . digits [exponent]; no name may follow.
  void lex_number(std::size_t i) {
    std::size_t j = i;
    while (j < text_.size() && is_digit(text_[j])) ++j;
    if (j < text_.size() && text_[j] == '.') {
      ++j;
      while (j < text_.size() && is_digit(text_[j])) ++j;
    }
    if (j < text_.size() && (text_[j] == 'e' || text_[j] == 'E')) {
      std::size_t k = j + 1;
      if (k < text_.size() && (text_[k] == '+' || text_[k] == '-')) ++k;
      if (k < text_.size() && is_digit(text_[k])) {
        while (k < text_.size() && is_digit(text_[k])) ++k;
        j = k;
      } else {
        j = k;  // "1e" or "1e+": shown whole in the error below
        while (j < text_.size() && is_name_char(text_[j])) ++j;
        fail(i, "malformed number '" + shown(text_.substr(i, j - i)) + "'");
      }
    }
    if (j < text_.size() && (is_name_char(text_[j]) || text_[j] == '.')) {
      std::size_t k = j;
      while (k < text_.size() && (is_name_char(text_[k]) || text_[k] == '.')) ++k;
      fail(i, "malformed number '" + shown(text_.substr(i, k - i)) + "'");
    }
    double v = 0;
    const auto [end, ec] = std::from_chars(text_.data() + i, text_.data() + j, v);
    if (ec == std::errc::result_out_of_range) {
      fail(i, "number '" + shown(text_.substr(i, j - i)) + "' is out of range for a float64");
    }
    if (ec != std::errc() || end != text_.data() + j) {
      fail(i, "malformed number '" + shown(text_.substr(i, j - i)) + "'");
    }
    tok_.kind = Tok::number;
    tok_.len = j - i;
    tok_.value = v;
  }

  // ---- Nodes

  int add(Node n) {
    ctx_.nodes.push_back(n);
    return static_cast<int>(ctx_.nodes.size()) - 1;
  }
  int add_op(CalcOp op, std::size_t pos, int a, int b = -1, int c = -1) {
    Node n;
    n.op = op;
    n.a = a, n.b = b, n.c = c;
    n.pos = pos;
    return add(n);
  }
  int add_constant(double v, std::size_t pos) {
    Node n;
    n.op = CalcOp::constant;
    n.value = v;
    n.pos = pos;
    return add(n);
  }

  // ---- Grammar, lowest precedence first (docs/band-math.md has the table)

  int ternary() {
    const int cond = or_expr();
    if (tok_.kind != Tok::question) return cond;
    const std::size_t q = tok_.pos;
    advance();
    Level level(*this, q);
    const int yes = ternary();
    if (tok_.kind != Tok::colon) {
      fail(tok_.pos, "expected ':' for the '?' at column " + std::to_string(column(q)) +
                         ", found " + describe(tok_));
    }
    advance();
    const int no = ternary();
    return add_op(CalcOp::select, q, cond, yes, no);
  }

  int or_expr() {
    int left = and_expr();
    while (tok_.kind == Tok::oror || at_keyword("or")) {
      const std::size_t pos = tok_.pos;
      advance();
      left = add_op(CalcOp::logical_or, pos, left, and_expr());
    }
    return left;
  }

  int and_expr() {
    int left = not_expr();
    while (tok_.kind == Tok::andand || at_keyword("and")) {
      const std::size_t pos = tok_.pos;
      advance();
      left = add_op(CalcOp::logical_and, pos, left, not_expr());
    }
    return left;
  }

  int not_expr() {
    if (!at_keyword("not")) return comparison();
    const std::size_t pos = tok_.pos;
    advance();
    Level level(*this, pos);
    return add_op(CalcOp::logical_not, pos, not_expr());
  }

  static bool comparison_op(Tok t, CalcOp& op) {
    switch (t) {
      case Tok::lt:
        op = CalcOp::lt;
        return true;
      case Tok::le:
        op = CalcOp::le;
        return true;
      case Tok::gt:
        op = CalcOp::gt;
        return true;
      case Tok::ge:
        op = CalcOp::ge;
        return true;
      case Tok::eq:
        op = CalcOp::eq;
        return true;
      case Tok::ne:
        op = CalcOp::ne;
        return true;
      default:
        return false;
    }
  }

  int comparison() {
    const int left = additive();
    CalcOp op{};
    if (!comparison_op(tok_.kind, op)) return left;
    const std::size_t pos = tok_.pos;
    advance();
    const int result = add_op(op, pos, left, additive());
    if (comparison_op(tok_.kind, op)) {
      fail(tok_.pos,
           "chained comparison (Python would read it as two joined by 'and', C as the first "
           "result compared again): add parentheses");
    }
    return result;
  }

  int additive() {
    int left = term();
    while (tok_.kind == Tok::plus || tok_.kind == Tok::minus) {
      const CalcOp op = tok_.kind == Tok::plus ? CalcOp::add : CalcOp::sub;
      const std::size_t pos = tok_.pos;
      advance();
      left = add_op(op, pos, left, term());
    }
    return left;
  }

  int term() {
    int left = unary();
    while (tok_.kind == Tok::star || tok_.kind == Tok::slash) {
      const CalcOp op = tok_.kind == Tok::star ? CalcOp::mul : CalcOp::div;
      const std::size_t pos = tok_.pos;
      advance();
      left = add_op(op, pos, left, unary());
    }
    return left;
  }

  /// Unary - + ! bind looser than a power on their right: -2**2 is -(2**2), as in Python.
  int unary() {
    if (tok_.kind != Tok::minus && tok_.kind != Tok::plus && tok_.kind != Tok::bang) {
      return power();
    }
    const Tok kind = tok_.kind;
    const std::size_t pos = tok_.pos;
    advance();
    Level level(*this, pos);
    const int operand = unary();
    if (kind == Tok::plus) return operand;
    return add_op(kind == Tok::minus ? CalcOp::neg : CalcOp::logical_not, pos, operand);
  }

  /// primary [(** | ^) unary]: right-associative (2**3**2 is 2**9), and the exponent may carry
  /// a sign (2**-1).
  int power() {
    const int base = primary();
    if (tok_.kind != Tok::power) return base;
    const std::size_t pos = tok_.pos;
    advance();
    Level level(*this, pos);
    const int exponent = unary();
    const int n = add_op(CalcOp::pow, pos, base, exponent);
    ctx_.nodes[static_cast<std::size_t>(n)].pow_operator = true;
    return n;
  }

  int primary() {
    switch (tok_.kind) {
      case Tok::number: {
        const int n = add_constant(tok_.value, tok_.pos);
        advance();
        return n;
      }
      case Tok::lparen: {
        const std::size_t open = tok_.pos;
        advance();
        Level level(*this, open);
        const int inner = ternary();
        expect_close(open);
        return inner;
      }
      case Tok::name:
        if (!is_keyword(text_of(tok_))) return name();
        [[fallthrough]];
      default:
        fail(tok_.pos, "unexpected " + describe(tok_) + " (expected a value)");
    }
  }

  void expect_close(std::size_t open) {
    if (tok_.kind != Tok::rparen) {
      fail(tok_.pos, "expected ')' to close the '(' at column " + std::to_string(column(open)) +
                         ", found " + describe(tok_));
    }
    advance();
  }

  int name() {
    const std::string_view id = text_of(tok_);
    const std::size_t pos = tok_.pos;
    const Function* f = find_function(id);
    const Constant* c = f ? nullptr : find_constant(id);
    const auto it = ctx_.input_index.find(id);
    // Before reading the next token: an unknown name is reported before what follows it.
    if (!f && !c && it == ctx_.input_index.end()) fail(pos, "unknown name '" + shown(id) + "'");
    advance();
    if (f) return call(*f, pos);
    if (c) {
      if (tok_.kind == Tok::lparen)
        fail(pos, "'" + std::string(id) + "' is a constant, not a function");
      return add_constant(c->value, pos);
    }
    const int input = it->second;
    const int count = ctx_.inputs[static_cast<std::size_t>(input)].band_count;
    const std::string quoted = "'" + std::string(id) + "'";
    if (tok_.kind == Tok::lparen) fail(pos, "input " + quoted + " is not a function");
    long long band = 1;
    if (tok_.kind == Tok::lbracket) {
      advance();
      const std::string_view digits = text_of(tok_);
      if (tok_.kind != Tok::number || !std::all_of(digits.begin(), digits.end(), is_digit)) {
        fail(tok_.pos, "a band of " + quoted + " is a whole number, as in " + std::string(id) +
                           "[1], not " + describe(tok_));
      }
      const std::size_t band_pos = tok_.pos;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), band);
      if (ec != std::errc() || end != digits.data() + digits.size()) {
        band = std::numeric_limits<long long>::max();  // beyond any band count
      }
      if (band < 1 || band > count) {
        const std::string has =
            count == 1 ? "it has 1 band" : "it has bands 1 to " + std::to_string(count);
        fail(band_pos, "band " + shown(digits) + " of input " + quoted + " does not exist (" + has +
                           "; bands are numbered from 1)");
      }
      advance();
      if (tok_.kind != Tok::rbracket) {
        fail(tok_.pos, "expected ']' after the band of " + quoted + ", found " + describe(tok_));
      }
      advance();
    } else if (count != 1) {
      fail(pos, "input " + quoted + " has " + std::to_string(count) + " bands: name one, as " +
                    std::string(id) + "[1] to " + std::string(id) + "[" + std::to_string(count) +
                    "]");
    }
    Node n;
    n.op = CalcOp::load;
    n.slot = ctx_.slot(input, static_cast<int>(band));
    n.pos = pos;
    return add(n);
  }

  int call(const Function& f, std::size_t pos) {
    if (tok_.kind != Tok::lparen) {
      fail(pos, "function '" + std::string(f.name) + "' needs its arguments in parentheses, as " +
                    std::string(f.name) + "(...)");
    }
    const std::size_t open = tok_.pos;
    advance();
    Level level(*this, open);
    std::vector<int> args;
    if (tok_.kind != Tok::rparen) {
      while (true) {
        args.push_back(ternary());
        if (tok_.kind != Tok::comma) break;
        advance();
      }
    }
    if (tok_.kind != Tok::rparen) {
      fail(tok_.pos, "expected ',' or ')' in the call of " + std::string(f.name) + "() at column " +
                         std::to_string(column(pos)) + ", found " + describe(tok_));
    }
    advance();
    const int n = static_cast<int>(args.size());
    if (n < f.min_args || (f.max_args != 0 && n > f.max_args)) {
      const std::string takes = f.max_args == 0 ? std::to_string(f.min_args) + " or more arguments"
                                : f.min_args == 1 ? std::string("1 argument")
                                                  : std::to_string(f.min_args) + " arguments";
      fail(pos, std::string(f.name) + "() takes " + takes + ", not " + std::to_string(n));
    }
    if (operand_count_of(f.op) == 1) return add_op(f.op, pos, args[0]);
    if (f.op == CalcOp::select) return add_op(f.op, pos, args[0], args[1], args[2]);
    int left = add_op(f.op, pos, args[0], args[1]);  // min/max of many: a left fold
    for (std::size_t k = 2; k < args.size(); ++k) left = add_op(f.op, pos, left, args[k]);
    return left;
  }

  static int operand_count_of(CalcOp op) { return ops::calc::operand_count(op); }

  Context& ctx_;
  std::string_view text_;
  std::size_t index_;
  Token tok_;
  std::size_t next_ = 0;  ///< where the lexer reads the token after tok_
  int depth_ = 0;
};

// ---- Fold and lower

/// Throws for expression @p index; set by compile for the lowering passes.
struct Failer {
  const char* who;
  const std::vector<std::string>& expressions;
  [[noreturn]] void operator()(std::size_t index, std::size_t pos, const std::string& what) const {
    fail_at(who, index, expressions.size(), expressions[index], pos, what);
  }
};

struct Root {
  int node;
  std::size_t expression;
};

template <class C>
CalcCode lower(std::vector<Node> w, const std::vector<Root>& roots, const Failer& fail) {
  using ops::calc::apply;
  using ops::calc::operand_count;
  const std::size_t n = w.size();
  // Fold, in operand-first order. repl[i]: the node that stands for node i (x**1 is x).
  std::vector<int> repl(n);
  for (std::size_t i = 0; i < n; ++i) {
    Node& x = w[i];
    repl[i] = static_cast<int>(i);
    const int k = operand_count(x.op);
    if (k == 0) continue;
    int* operand[3] = {&x.a, &x.b, &x.c};
    bool all_constant = true;
    for (int j = 0; j < k; ++j) {
      *operand[j] = repl[static_cast<std::size_t>(*operand[j])];
      all_constant =
          all_constant && w[static_cast<std::size_t>(*operand[j])].op == CalcOp::constant;
    }
    const auto value = [&](int j) {  // operand j of x as it is now (a rewrite drops operands)
      return j < operand_count(x.op)
                 ? static_cast<C>(w[static_cast<std::size_t>(*operand[j])].value)
                 : C(0);
    };
    if (x.op == CalcOp::pow && x.pow_operator &&
        w[static_cast<std::size_t>(x.b)].op == CalcOp::constant) {
      // numpy's ** on float arrays: fast paths for these exponents (pow() has none). Chosen
      // before folding, so that a constant base is folded by the operation its pixels would
      // run: (-0.0) ** 0.5 is sqrt(-0.0), -0.0, as on pixels, not pow's +0.
      const C e = value(1);
      if (e == C(1)) {
        repl[i] = x.a;
        continue;
      }
      if (e == C(2)) {
        x.op = CalcOp::square;
      } else if (e == C(0.5)) {
        x.op = CalcOp::sqrt;
      } else if (e == C(-1)) {
        x.op = CalcOp::reciprocal;
      }
      if (x.op != CalcOp::pow) x.b = -1;
    }
    if (all_constant) {
      x.value = static_cast<double>(apply<C>(x.op, value(0), value(1), value(2)));
      x.op = CalcOp::constant;
      x.a = x.b = x.c = -1;
    }
  }
  // Registers each subtree needs; the result register is never an operand's.
  std::vector<int> need(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& x = w[i];
    const int k = operand_count(x.op);
    if (k == 0) continue;
    int s[3] = {need[static_cast<std::size_t>(x.a)],
                k > 1 ? need[static_cast<std::size_t>(x.b)] : 0,
                k > 2 ? need[static_cast<std::size_t>(x.c)] : 0};
    for (int j = 1; j < k; ++j) {  // descending (std::sort here trips GCC 12's -Warray-bounds)
      for (int m = j; m > 0 && s[m - 1] < s[m]; --m) std::swap(s[m - 1], s[m]);
    }
    int r = k + 1;
    for (int j = 0; j < k; ++j) r = std::max(r, s[j] + j);
    need[i] = r;
  }

  CalcCode out;
  std::unordered_map<std::uint64_t, int> constant_index;
  std::uint64_t used = 0;  // one bit per register
  std::size_t current = 0;
  const auto alloc = [&](const Node& at) {
    const int r = used == ~std::uint64_t{0} ? 64 : __builtin_ctzll(~used);
    if (r >= ops::kCalcMaxRegisters) {
      fail(current, at.pos,
           "expression needs more than " + std::to_string(ops::kCalcMaxRegisters) +
               " registers to evaluate: split it into simpler expressions");
    }
    used |= std::uint64_t{1} << r;
    out.registers = std::max(out.registers, r + 1);
    return static_cast<std::uint8_t>(r);
  };
  const auto release = [&](std::uint8_t r) { used &= ~(std::uint64_t{1} << r); };
  const auto emit = [&](CalcOp op, std::uint8_t dst, std::uint8_t a, std::uint8_t b, std::uint8_t c,
                        std::int32_t arg) {
    CalcInstr in;
    in.op = op;
    in.dst = dst, in.a = a, in.b = b, in.c = c;
    in.arg = arg;
    out.code.push_back(in);
  };
  const auto leaf = [&](const Node& x) {
    const std::uint8_t r = alloc(x);
    if (x.op == CalcOp::load) {
      emit(CalcOp::load, r, 0, 0, 0, x.slot);
    } else {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &x.value, sizeof bits);
      const auto [it, added] = constant_index.emplace(bits, static_cast<int>(out.constants.size()));
      if (added) out.constants.push_back(x.value);
      emit(CalcOp::constant, r, 0, 0, 0, it->second);
    }
    return r;
  };

  struct Frame {
    int node;
    int count;     ///< operands
    int done = 0;  ///< operands evaluated
    int order[3] = {0, 1, 2};
    std::uint8_t reg[3] = {0, 0, 0};
  };
  std::vector<Frame> stack;
  for (std::size_t k = 0; k < roots.size(); ++k) {
    current = roots[k].expression;
    const int root = repl[static_cast<std::size_t>(roots[k].node)];
    std::uint8_t result = 0;
    const auto push = [&](int node) {
      const Node& x = w[static_cast<std::size_t>(node)];
      Frame f;
      f.node = node;
      f.count = operand_count(x.op);
      const int operands[3] = {x.a, x.b, x.c};
      std::stable_sort(f.order, f.order + f.count, [&](int p, int q) {
        return need[static_cast<std::size_t>(operands[p])] >
               need[static_cast<std::size_t>(operands[q])];
      });
      stack.push_back(f);
    };
    const auto deliver = [&](std::uint8_t r) {
      if (stack.empty()) {
        result = r;
        return;
      }
      Frame& parent = stack.back();
      parent.reg[parent.order[parent.done]] = r;
      ++parent.done;
    };
    push(root);
    while (!stack.empty()) {
      const Frame f = stack.back();
      const Node& x = w[static_cast<std::size_t>(f.node)];
      if (f.count == 0) {
        stack.pop_back();
        deliver(leaf(x));
        continue;
      }
      if (f.done < f.count) {
        const int operands[3] = {x.a, x.b, x.c};
        push(operands[f.order[f.done]]);
        continue;
      }
      const std::uint8_t dst = alloc(x);
      emit(x.op, dst, f.reg[0], f.count > 1 ? f.reg[1] : 0, f.count > 2 ? f.reg[2] : 0, 0);
      for (int j = 0; j < f.count; ++j) release(f.reg[j]);
      stack.pop_back();
      deliver(dst);
    }
    emit(CalcOp::store, 0, result, 0, 0, static_cast<std::int32_t>(k));
    release(result);
  }
  return out;
}

}  // namespace

CalcCompiled compile_calc_expressions(const char* who, const std::vector<std::string>& expressions,
                                      const std::vector<CalcInputBands>& inputs) {
  const std::string w = std::string(who) + ": ";
  if (expressions.empty()) throw std::invalid_argument(w + "no expressions");
  Context ctx{who, inputs, {}, {}, {}, {}, expressions.size()};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string& name = inputs[i].name;
    const std::string quoted = "'" + shown(name) + "'";
    if (!is_identifier(name)) {
      throw std::invalid_argument(w + "input name " + quoted +
                                  " is not a name (letters, digits and '_', not starting with a "
                                  "digit)");
    }
    if (find_function(name)) {
      throw std::invalid_argument(w + "input name " + quoted + " is the name of a function");
    }
    if (find_constant(name)) {
      throw std::invalid_argument(w + "input name " + quoted + " is the name of a constant");
    }
    if (is_keyword(name)) throw std::invalid_argument(w + "input name " + quoted + " is a keyword");
    if (inputs[i].band_count < 1) {
      throw std::invalid_argument(w + "input " + quoted + " has " +
                                  std::to_string(inputs[i].band_count) + " bands (at least 1)");
    }
    if (!ctx.input_index.emplace(name, static_cast<int>(i)).second) {
      throw std::invalid_argument(w + "input name " + quoted + " is given twice");
    }
  }
  std::vector<Root> roots;
  for (std::size_t k = 0; k < expressions.size(); ++k) {
    Parser parser(ctx, expressions[k], k);
    roots.push_back(Root{parser.parse(), k});
  }
  CalcCompiled out;
  out.expressions = expressions;
  out.inputs = inputs;
  out.slots = ctx.slots;
  for (const CalcInputBands& in : inputs) out.bands_read.push_back(CalcBandUse{in.name, {}});
  for (const CalcSlotRef& s : ctx.slots) {
    out.bands_read[static_cast<std::size_t>(s.input)].bands.push_back(s.band);
  }
  for (CalcBandUse& u : out.bands_read) std::sort(u.bands.begin(), u.bands.end());
  const Failer fail{who, expressions};
  out.f64 = lower<double>(ctx.nodes, roots, fail);
  out.f32 = lower<float>(std::move(ctx.nodes), roots, fail);
  return out;
}

CalcProgram CalcAccess::make(CalcCompiled compiled) {
  CalcProgram p;
  p.impl_ = std::make_shared<const CalcCompiled>(std::move(compiled));
  return p;
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

namespace {
const detail::CalcCompiled& empty_compiled() {
  static const detail::CalcCompiled empty;
  return empty;
}
const detail::CalcCompiled& compiled_of(const std::shared_ptr<const detail::CalcCompiled>& p) {
  return p ? *p : empty_compiled();
}
}  // namespace

const std::vector<std::string>& CalcProgram::expressions() const noexcept {
  return compiled_of(impl_).expressions;
}

const std::vector<CalcInputBands>& CalcProgram::inputs() const noexcept {
  return compiled_of(impl_).inputs;
}

const std::vector<CalcBandUse>& CalcProgram::bands_read() const noexcept {
  return compiled_of(impl_).bands_read;
}

const std::vector<int>& CalcProgram::bands_read(std::string_view name) const {
  for (const CalcBandUse& u : compiled_of(impl_).bands_read) {
    if (u.name == name) return u.bands;
  }
  throw std::invalid_argument("CalcProgram::bands_read: no input '" + detail::printable(name) +
                              "'");
}

int CalcProgram::registers() const noexcept {
  const detail::CalcCompiled& c = compiled_of(impl_);
  return std::max(c.f64.registers, c.f32.registers);  // folding may differ between the two
}

std::size_t CalcProgram::instruction_count() const noexcept {
  return compiled_of(impl_).f64.code.size();
}

}  // namespace vibespatial::raster
