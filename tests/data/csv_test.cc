// CSV loaders: header detection, label column selection, line endings, quoting, and every
// malformed-input class (messages must name FILE:LINE and the column).
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "data/dataset.h"
#include "log_capture.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"
#include "util/strings.h"

namespace dtrain {
namespace {

using testing::contains;
using testing::TempDir;
using testing::user_error;

namespace fs = std::filesystem;

CsvOptions opts(const std::string& header = "auto", const std::string& label = "",
                char delim = ',') {
  CsvOptions o;
  o.header = parse_enum<CsvHeader>(header).value();
  o.label_column = label;
  o.delimiter = delim;
  return o;
}

TEST_CASE("csv: auto header, label defaults to the last column") {
  TempDir t;
  const Dataset d = load_csv(t.write("a.csv", "f1,f2,label\n1.5,2,0\n-3,4e1,2\n"), opts());
  CHECK(d.rows == 2);
  CHECK(d.features == 2);
  CHECK(d.x == std::vector<float>{1.5f, 2.0f, -3.0f, 40.0f});
  CHECK(d.y == std::vector<int32_t>{0, 2});
  CHECK(d.num_classes == 3);
}

TEST_CASE("csv: numbers below float's smallest round to 0, above its largest are refused") {
  TempDir t;
  const Dataset d = load_csv(t.write("u.csv", "a,y\n1e-50,0\n-1e-300,1\n2,0\n"), opts());
  CHECK(d.x == std::vector<float>{0.0f, -0.0f, 2.0f});
  CHECK_THROWS_AS(load_csv(t.write("o.csv", "a,y\n1e39,0\n2,1\n"), opts()), UserError);
}

TEST_CASE("csv: auto without header keeps the first row as data") {
  TempDir t;
  const Dataset d = load_csv(t.write("a.csv", "1,2,1\n3,4,0"), opts());  // no final newline
  CHECK(d.rows == 2);
  CHECK(d.x == std::vector<float>{1, 2, 3, 4});
  CHECK(d.y == std::vector<int32_t>{1, 0});
}

TEST_CASE("csv: forced header") {
  TempDir t;
  const std::string p = t.write("a.csv", "1,2,1\n3,4,0\n5,6,1\n");
  CHECK(load_csv(p, opts("true")).rows == 2);  // numeric first row treated as a header
  CHECK(load_csv(p, opts("false")).rows == 3);
  const std::string h = t.write("h.csv", "a,b,y\n3,4,0\n");
  const std::string msg = user_error([&] { load_csv(h, opts("false")); });
  CHECK(contains(msg, h + ":1:"));
  CHECK(contains(msg, "column 1"));
  CHECK(contains(msg, "\"a\" is not a number"));
}

TEST_CASE("csv: label column by name and by index") {
  TempDir t;
  const std::string p = t.write("a.csv", "label,f1,f2\n2,10,11\n0,20,21\n");
  const Dataset by_name = load_csv(p, opts("auto", "label"));
  CHECK(by_name.y == std::vector<int32_t>{2, 0});
  CHECK(by_name.x == std::vector<float>{10, 11, 20, 21});
  const Dataset by_index = load_csv(p, opts("auto", "0"));
  CHECK(by_index.y == by_name.y);
  CHECK(by_index.x == by_name.x);
  // A middle column as label: features keep their relative order.
  const Dataset mid = load_csv(t.write("m.csv", "5,1,6\n7,0,8\n"), opts("false", "1"));
  CHECK(mid.y == std::vector<int32_t>{1, 0});
  CHECK(mid.x == std::vector<float>{5, 6, 7, 8});

  const std::string bad_name = user_error([&] { load_csv(p, opts("auto", "target")); });
  CHECK(contains(bad_name, "\"target\" not found"));
  CHECK(contains(bad_name, "label, f1, f2"));
  CHECK(contains(bad_name, p));
  CHECK(contains(user_error([&] { load_csv(p, opts("auto", "3")); }), "out of range"));
  const std::string no_header = t.write("n.csv", "1,2,0\n");
  CHECK(contains(user_error([&] { load_csv(no_header, opts("auto", "y")); }), "no header"));
  // A name the header holds twice: the second column was silently a feature (the label itself).
  const std::string dup = t.write("dup.csv", "y,a,y\n0,1,0\n1,3,1\n");
  CHECK(contains(
      user_error([&] { load_csv(dup, opts("auto", "y")); }),
      "label column \"y\" is ambiguous: the header of '" + dup + "' names columns 0 and 2 so"));
  CHECK(load_csv(dup, opts("auto", "2")).y == std::vector<int32_t>{0, 1});
}

TEST_CASE("csv: a label column index that is also another column's header name is said") {
  // (the column named "0", index 3, was taken silently; a header with a number for a name is
  // only read as one under data.csv.header: true) The name wins, as it did, with a warning:
  // refusing left a numeric header (pandas' ",0,1,2") with no spelling for a middle column.
  TempDir t;
  const std::string p = t.write("g.csv", "grp,x,y,0\n1,2,3,0\n0,5,6,1\n");
  dtrain::testing::LogCapture log;
  CHECK(load_csv(p, opts("true", "0")).y == std::vector<int32_t>{0, 1});
  CHECK(contains(log.text(),
                 "data.csv.label_column \"0\" is the name of column 3 in the header "
                 "of '" +
                     p +
                     "', the label taken; 0 is also the 0-based index of column 0 "
                     "(\"grp\"): if that one is meant, give its name"));
  CHECK(load_csv(p, opts("true", "3")).y == std::vector<int32_t>{0, 1});
  CHECK(load_csv(p, opts("true", "grp")).y == std::vector<int32_t>{1, 0});
  // A name that is its own column's index, or an index past the columns, is no ambiguity.
  CHECK(load_csv(t.write("s.csv", "0,x,y\n1,2,3\n0,5,6\n"), opts("true", "0")).y ==
        std::vector<int32_t>{1, 0});
  CHECK(load_csv(t.write("p.csv", "a,7\n1,1\n2,0\n"), opts("true", "7")).y ==
        std::vector<int32_t>{1, 0});
}

TEST_CASE("csv: a header that is not UTF-8 is refused when read, naming the column and its bytes") {
  // It trained to the end, then failed writing the column names into the checkpoint's JSON.
  TempDir t;
  const std::string p = t.write("latin1.csv", "a,b,caf\xe9,d,label\n1,2,3,4,0\n5,6,7,8,1\n");
  CHECK(user_error([&] { load_csv(p, opts()); }) ==
        p +
            ":1: the header's column 3 (\"caf\\xE9\") is not UTF-8 text (byte 0xE9 at its byte "
            "4: Latin-1 or another 8-bit encoding?); column names are kept as UTF-8 in the "
            "checkpoint: convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 '" +
            p + "' > OUT");
  // The label's name is not kept: it may be in any encoding. UTF-8 names (café) pass; data rows
  // are numbers, checked as such.
  CHECK(load_csv(t.write("l.csv", "a,\xe9t\xe9\n1,0\n2,1\n"), opts()).y ==
        std::vector<int32_t>{0, 1});
  CHECK(load_csv(t.write("u.csv", "caf\xc3\xa9,y\n1,0\n2,1\n"), opts()).columns ==
        std::vector<std::string>{"caf\xc3\xa9"});
  CHECK(contains(user_error([&] { load_csv(t.write("r.csv", "a,y\n1\xe9,0\n"), opts()); }),
                 ":2: column 1 (\"a\"): \"1?\" is not a number"));
}

TEST_CASE("csv: a first row of one column says its line, and hints at comments and delimiters") {
  TempDir t;
  const std::string semi = t.write("semi.csv", "\n\na;b;c;label\n1;2;3;0\n");
  CHECK(user_error([&] { load_csv(semi, opts()); }) ==
        semi +
            ":3: the first row has only 1 column (\"a;b;c;label\"): need at least one feature "
            "and a label; the row holds ';': if it separates the columns, set data.csv.delimiter "
            "to it (--set 'data.csv.delimiter=;')");
  const std::string tab = t.write("tab.csv", "1\t2\t0\n");
  CHECK(contains(user_error([&] { load_csv(tab, opts()); }),
                 "the row holds '\\t': if it separates the columns, set data.csv.delimiter to "
                 "it (--set 'data.csv.delimiter=\\t')"));
  CHECK(contains(user_error([&] { load_csv(t.write("bar.csv", "a|y\n1|0\n"), opts()); }),
                 "(--set 'data.csv.delimiter=|')"));
  // with ';' as the delimiter, a comma file is hinted the other way
  CHECK(
      contains(user_error([&] { load_csv(t.write("c.csv", "a,y\n1,0\n"), opts("auto", "", ';')); }),
               "(--set 'data.csv.delimiter=,')"));
  const std::string comment = t.write("comment.csv", "# exported 2026-12-07\na,b,y\n1,2,0\n");
  CHECK(user_error([&] { load_csv(comment, opts()); }) ==
        comment +
            ":1: the first row has only 1 column (\"# exported 2026-12-07\"): need at least one "
            "feature and a label; lines starting with '#' are not comments to this reader (CSV "
            "has none): remove them (grep -v '^#' IN > OUT)");
  // a comment holding commas: read as a header, refused as one starting with '#' (its columns
  // are not the data's: that was said at line 2)
  const std::string c2 = t.write("c2.csv", "# a, b\n1,2,3,0\n");
  CHECK(contains(user_error([&] { load_csv(c2, opts()); }), ":1: the first row starts with '#'"));
  // a header after '#' (numpy.savetxt's), read as a header or told to be one: refused, not
  // taken with a first column named "# a"
  const std::string numpy = t.write("np.csv", "# a,b,y\n1,2,0\n");
  CHECK(user_error([&] { load_csv(numpy, opts()); }) ==
        numpy +
            ":1: the first row starts with '#' (\"# a\"): lines starting with '#' are not "
            "comments to this reader (CSV has none), and as a header it names its first column "
            "so: remove the '#' (numpy.savetxt writes one before its header unless given "
            "comments=''), or set data.csv.header: true if a column's name starts with it");
  // (told it is a header: a column may be named so)
  CHECK(testing::user_error_of([&] { load_csv(numpy, opts("true")); }).empty());
  // no hint when there is nothing to say; predict's input gets the delimiter hint too
  CHECK(user_error([&] {
          load_csv(t.write("one.csv", "1\n2\n"), opts());
        }).ends_with("only 1 column (\"1\"): need at least one feature and a label"));
  CHECK(contains(
      user_error([&] { load_csv_features(t.write("in.csv", "1;2;3\n"), opts(), 3, nullptr, {}); }),
      "expected 3 feature columns (the model's input size), found 1; the row holds "
      "';'"));
}

TEST_CASE("csv: numbers past a double's range are outside float32's range, not \"not a number\"") {
  TempDir t;
  const std::string digits(10'000'000, '9');
  for (const std::string& n :
       {std::string("1e309"), std::string("-1e309"), std::string("+1e400"), digits}) {
    CAPTURE(n.substr(0, 20));
    const std::string p = t.write("o.csv", "a,y\n" + n + ",0\n");
    const std::string msg = user_error([&] { load_csv(p, opts()); });
    CHECK(contains(msg, p + ":2: column 1 (\"a\"): \"" + shown_text(n) +
                            "\" is outside float32's range (magnitudes up to 3.4e38)"));
    // predict's input, a header-less first row, and a label
    CHECK(contains(user_error([&] { load_csv_features(p, opts(), 2, nullptr, {}); }),
                   "is outside float32's range"));
    CHECK(contains(user_error([&] { load_csv(t.write("h.csv", n + ",1,0\n1,2,0\n"), opts()); }),
                   "is outside float32's range"));
    CHECK(contains(user_error([&] { load_csv(t.write("l.csv", "a,y\n1," + n + "\n"), opts()); }),
                   n[0] == '-' ? "is negative" : "is too large (at most 1048575)"));
  }
  // below a double's smallest: rounds to 0, as before; not numbers stay "not a number"
  CHECK(load_csv(t.write("u.csv", "a,y\n1e-400,0\n2,1\n"), opts()).x ==
        std::vector<float>{0.0f, 2.0f});
  // a label that small is no class either, and not "too large" (from_chars' out of range)
  CHECK_FALSE(
      contains(user_error([&] { load_csv(t.write("s.csv", "a,y\n1,1e-400\n2,1\n"), opts()); }),
               "too large"));
  CHECK(contains(user_error([&] { load_csv(t.write("n.csv", "a,y\n1e309x,0\n"), opts()); }),
                 "\"1e309x\" is not a number"));
}

TEST_CASE("csv: CRLF, blank lines, spaces, other delimiters, quotes") {
  TempDir t;
  const Dataset d =
      load_csv(t.write("a.csv", "f1,f2,y\r\n1, 2 ,0\r\n\r\n   \r\n3,\t4,1\r\n\r\n"), opts());
  CHECK(d.rows == 2);
  CHECK(d.x == std::vector<float>{1, 2, 3, 4});
  CHECK(d.y == std::vector<int32_t>{0, 1});

  const Dataset bom = load_csv(t.write("bom.csv", "\xEF\xBB\xBFy,f\n1,2\n"), opts("auto", "y"));
  CHECK(bom.y == std::vector<int32_t>{1});
  CHECK(bom.x == std::vector<float>{2});

  const Dataset semi = load_csv(t.write("s.csv", "a;b;y\n1;2;3\n"), opts("auto", "", ';'));
  CHECK(semi.x == std::vector<float>{1, 2});
  CHECK(semi.y == std::vector<int32_t>{3});

  const Dataset tab = load_csv(t.write("t.tsv", "a\tb\ty\n1\t2\t3\n"), opts("auto", "", '\t'));
  CHECK(tab.x == std::vector<float>{1, 2});
  // A row of only delimiters is a row of empty cells, reported, as ",," is (it was skipped as
  // a blank line); a blank line (spaces only) is still skipped.
  const std::string holes = t.write("h.tsv", "a\tb\ty\n1\t2\t3\n\t\t\n  \n");
  CHECK(contains(user_error([&] { load_csv(holes, opts("auto", "", '\t')); }),
                 "h.tsv:3: column 1 (\"a\"): empty cell"));
  CHECK(load_csv(t.write("b.tsv", "a\tb\ty\n1\t2\t3\n  \n"), opts("auto", "", '\t')).x.size() == 2);

  const std::string q = t.write("q.csv", "\"f,1\",\"say \"\"hi\"\"\",\"y\"\n\"1\",2,\"0\"\n");
  const Dataset quoted = load_csv(q, opts("auto", "say \"hi\""));
  CHECK(quoted.x == std::vector<float>{1, 0});
  CHECK(quoted.y == std::vector<int32_t>{2});
  CHECK(contains(user_error([&] { load_csv(t.write("u.csv", "a,\"b\n1,2\n"), opts()); }),
                 "unterminated"));
}

TEST_CASE("csv: labels must be non-negative integers") {
  TempDir t;
  CHECK(load_csv(t.write("ok.csv", "x,y\n1,3.0\n2,+1\n3,0\n"), opts()).y ==
        std::vector<int32_t>{3, 1, 0});
  const std::string frac = t.write("frac.csv", "x,y\n1,1\n2,3.5\n");
  std::string msg = user_error([&] { load_csv(frac, opts()); });
  CHECK(contains(msg, frac + ":3:"));
  CHECK(contains(msg, "column 2 (\"y\")"));
  CHECK(contains(msg, "not an integer"));
  msg = user_error([&] { load_csv(t.write("neg.csv", "x,y\n1,-1\n"), opts()); });
  CHECK(contains(msg, "negative"));
  CHECK(contains(msg, ":2:"));
  msg = user_error([&] { load_csv(t.write("word.csv", "x,y\n1,cat\n"), opts()); });
  CHECK(contains(msg, "\"cat\" is not a number"));
  msg = user_error([&] { load_csv(t.write("big.csv", "x,y\n1,1e12\n"), opts()); });
  CHECK(contains(msg, "too large"));
  msg = user_error([&] { load_csv(t.write("nan.csv", "x,y\n1,nan\n"), opts()); });
  CHECK(contains(msg, "not a number"));
}

TEST_CASE("csv: malformed cells and rows name file, line and column") {
  TempDir t;
  struct Case {
    std::string text;
    std::string line;  // ":N:" expected in the message
    std::string part;  // another expected fragment
  };
  const Case cases[] = {
      {"a,b,y\n1,2,0\n1,2\n", ":3:", "expected 3 columns"},
      {"a,b,y\n1,2,0\n1,2,0,4\n", ":3:", "found 4"},
      {"a,b,y\n1,x,0\n", ":2:", "column 2 (\"b\")"},
      {"a,b,y\n1,,0\n", ":2:", "empty cell"},
      {"a,b,y\n1.5abc,2,0\n", ":2:", "\"1.5abc\" is not a number"},
      {"a,b,y\n1,inf,0\n", ":2:", "\"inf\" is not a number"},
      {"a,b,y\nnan,1,0\n", ":2:", "\"nan\" is not a number"},
      {"a,b,y\n1,1e99,0\n", ":2:", "\"1e99\" is outside float32's range (magnitudes up to 3.4e38)"},
      {"a,b,y\n1,0x10,0\n", ":2:", "\"0x10\" is not a number"},
      // A header name's bytes that are not UTF-8 are shown as '?' (they were printed raw).
      {"a\xe2\x80,y\n1,0\nx,1\n", ":1:", "column 1 (\"a\\xE2\\x80\")"},
      {"a\x01,y\n1,0\nx,1\n", ":3:", "column 1 (\"a?\")"},
      // Blank lines still count: the bad row is physical line 5.
      {"a,b,y\n1,2,0\n\n\r\n1,2,z\n", ":5:", "\"z\""},
      {"1,,0\n", ":1:", "empty cell"},  // an empty cell does not turn a row into a header
      // Bare CR line ends: said so (it was "mixes numbers and text: set header: true", then "a
      // header but no data rows"), with or without a header.
      {"a,b,label\r1,2,0\r3,4,1\r", ":1:", "the lines end in a bare carriage return"},
      {"1,2,0\r3,4,1\r", ":1:", "the lines end in a bare carriage return"},
      // A first row mixing numbers and text is neither silently a header nor silently data.
      {"1,2,x,4\n5,6,7,8\n", ":1:", "mixes 3 number(s) and 1 text cell(s) (column 3: \"x\""},
      {"1,n,0\n2,3,1\n", ":1:", "set data.csv.header: true"},
      // nan, inf and 1e39 read as numbers, unusable ones: the row is data, refused as such,
      // not a header dropped silently.
      {"NaN,1,0\n2,3,1\n", ":1:", "\"NaN\" is not a number"},
      {"nan,nan,nan\n1,2,0\n", ":1:", "\"nan\" is not a number"},
      // (beyond float32: said so, not "not a number")
      {"1e39,-inf,1\n1,2,0\n", ":1:", "\"1e39\" is outside float32's range"},
      {"1," + std::string(100000, 'x') + ",0\n",
       ":1:", "(column 2: \"" + std::string(60, 'x') + "... (100000 bytes)\" is not a number)"},
      // A long cell is cut (the whole 5 MB cell was the message), bytes that are not UTF-8 are '?'.
      {"a,b,y\n1," + std::string(100000, '2') + "x,0\n",
       ":2:", "\"" + std::string(60, '2') + "... (100001 bytes)\" is not a number"},
      {"a,b,y\n1,\xff\xfe,0\n", ":2:", "\"??\" is not a number"},
  };
  int i = 0;
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const std::string p = t.write("bad" + std::to_string(i++) + ".csv", c.text);
    const std::string msg = user_error([&] { load_csv(p, opts()); });
    CHECK(contains(msg, p + c.line));
    CHECK(contains(msg, c.part));
  }
  // Binary files are said to be such (an IDX file gave "a bare carriage return", a checkpoint
  // "stray quote"), an IDX file named as one.
  const std::string idx = t.write("img.idx", std::string("\0\0\x08\x03\0\0\0\x01\r\"x", 10));
  CHECK(contains(user_error([&] { load_csv(idx, opts()); }),
                 idx + ": not a CSV text file: it holds binary data or UTF-16 text (a NUL byte at "
                       "offset 0; CSV is read as UTF-8); it starts as an IDX file does"));
  const std::string utf16 = t.write("u16.csv", std::string("a\0,\0b\0\n\0", 8));
  CHECK(contains(user_error([&] { load_csv(utf16, opts()); }), "a NUL byte at offset 1"));
}

TEST_CASE("csv: empty inputs") {
  TempDir t;
  const std::string empty = t.write("empty.csv", "");
  CHECK(contains(user_error([&] { load_csv(empty, opts()); }), "empty data set: '" + empty));
  const std::string blank = t.write("blank.csv", "\n\r\n  \n");
  CHECK(contains(user_error([&] { load_csv(blank, opts()); }), "empty data set"));
  const std::string header_only = t.write("h.csv", "a,b,y\n");
  CHECK(contains(user_error([&] { load_csv(header_only, opts()); }), "no data rows"));
  const std::string one_col = t.write("one.csv", "1\n2\n");
  CHECK(contains(user_error([&] { load_csv(one_col, opts()); }), "only 1 column"));
  const std::string missing = t / "missing.csv";
  CHECK(contains(user_error([&] { load_csv(missing, opts()); }), missing));
}

TEST_CASE("csv: load_csv_features") {
  TempDir t;
  int64_t rows = -1;
  const std::vector<float> x =
      load_csv_features(t.write("p.csv", "a,b\r\n1,2\r\n3,4\r\n"), opts(), 2, &rows);
  CHECK(rows == 2);
  CHECK(x == std::vector<float>{1, 2, 3, 4});
  CHECK(load_csv_features(t.write("n.csv", "1,2\n"), opts(), 2, &rows).size() == 2);
  CHECK(rows == 1);

  const std::string wide = t.write("w.csv", "1,2,3\n4,5,6\n");
  std::string msg = user_error([&] { load_csv_features(wide, opts(), 2, &rows); });
  CHECK(contains(msg, wide + ":1:"));
  CHECK(contains(msg, "expected 2 feature columns"));
  CHECK(contains(msg, "found 3"));
  const std::string ragged = t.write("r.csv", "a,b\n1,2\n\n3\n");
  msg = user_error([&] { load_csv_features(ragged, opts(), 2, &rows); });
  CHECK(contains(msg, ragged + ":4:"));
  msg = user_error([&] { load_csv_features(t.write("x.csv", "1,2\n3,q\n"), opts(), 2, &rows); });
  CHECK(contains(msg, ":2:"));
  CHECK(contains(msg, "column 2"));
  CHECK(contains(user_error([&] { load_csv_features(t.write("e.csv", ""), opts(), 2, &rows); }),
                 "no rows"));
  // The training file's own header, numeric-looking names and all (which auto-detection refuses
  // as a mixed row), is a header: predict's input may carry it.
  const std::string numeric = t.write("num.csv", "a,2019\n0.3,2\n");
  CHECK(contains(user_error([&] { load_csv_features(numeric, opts(), 2, &rows); }),
                 "the first row mixes"));
  CHECK(load_csv_features(numeric, opts(), 2, &rows, {"a", "2019"}) ==
        std::vector<float>{0.3f, 2.0f});
  CHECK(rows == 1);
  // A header naming the training data's columns in another order (or other names): refused,
  // since the model reads by position (it predicted from swapped features before); the same
  // names, or no header, pass.
  const std::vector<std::string> train =
      load_csv(t.write("t.csv", "a,b,y\n1,2,0\n"), opts()).columns;
  CHECK(train == std::vector<std::string>{"a", "b"});
  const std::string swapped = t.write("s.csv", "b,a\n2,1\n");
  CHECK(user_error([&] { load_csv_features(swapped, opts(), 2, &rows, train); }) ==
        "'" + swapped +
            "' names its feature columns b, a, the training data's are a, b: the model reads "
            "columns by position, so give them in the training order (or drop the header row)");
  CHECK(load_csv_features(t.write("same.csv", "a,b\n1,2\n"), opts(), 2, &rows, train).size() == 2);
  CHECK(load_csv_features(t.write("none.csv", "1,2\n"), opts(), 2, &rows, train).size() == 2);
}

// Runs load_csv on path in a child process whose address space may grow by at most `room`
// bytes; returns the child's exit code (0: refused with a message containing `want`) and its
// peak RSS in KiB.
std::pair<int, long> load_csv_limited(const std::string& path, uint64_t room,
                                      const std::string& want) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::ifstream status("/proc/self/status");
    std::string line;
    uint64_t vm_kib = 0;
    while (std::getline(status, line))
      if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
    const rlimit rl{vm_kib * 1024 + room, vm_kib * 1024 + room};
    if (vm_kib == 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(6);
    try {
      load_csv(path, CsvOptions{});
    } catch (const UserError& e) {
      _exit(std::string(e.what()).find(want) != std::string::npos ? 0 : 3);
    } catch (...) {
      _exit(4);  // std::bad_alloc, mostly: what the check is there to prevent
    }
    _exit(5);  // loaded: not refused
  }
  int status = 0;
  rusage ru{};
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), ru.ru_maxrss};
}

TEST_CASE("csv: a file larger than this process can allocate is refused before it is read") {
  // A sparse 2 GiB file (no disk used) against 256 MiB of address space: refused from its size,
  // with the numbers, before a byte is read (before: std::bad_alloc, or 2 GiB of RSS).
  TempDir t;
  const std::string big = t.path() + "/big.csv";
  {
    std::ofstream f(big);
    f << "a,b\n1,2\n";
  }
  std::filesystem::resize_file(big, uint64_t{2} << 30);
  const auto [code, rss_kib] = load_csv_limited(big, uint64_t{256} << 20, "2147483648 bytes are");
  CHECK(code == 0);
  INFO("child peak RSS ", rss_kib, " KiB");
  CHECK(rss_kib < 128 * 1024);
}

TEST_CASE("csv: a gzip file that inflates past what can be allocated is refused" *
          doctest::skip(testing::kUnderSanitizer)) {
  // 512 MiB of zeros compress to about 0.5 MB; with 256 MiB of room, inflating stops at the
  // budget with a clear message instead of ending in std::bad_alloc.
  TempDir t;
  const std::string gz = t.path() + "/bomb.csv.gz";
  {
    gzFile f = gzopen(gz.c_str(), "wb1");
    REQUIRE(f != nullptr);
    const std::vector<char> zeros(1 << 20, 0);
    for (int i = 0; i < 512; ++i) REQUIRE(gzwrite(f, zeros.data(), zeros.size()) > 0);
    REQUIRE(gzclose(f) == Z_OK);
  }
  const auto [code, rss_kib] =
      load_csv_limited(gz, uint64_t{256} << 20, "compressed bytes inflate to");
  CHECK(code == 0);
  INFO("child peak RSS ", rss_kib, " KiB");
}

}  // namespace
}  // namespace dtrain
