#include "services/metrics/http/yaml_subset.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fuselink::services::http {
namespace {

static_assert(kMaxYamlDepth >= 3, "a web config nests three levels");

// One content line, cut into its parts.
struct Line {
  int number;
  int indent;
  std::string key;
  bool has_value;  // `key: value`, against `key:`
  std::string value;
};

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("web config line ", line, ": ", what));
}

// Printable ASCII: what a plain scalar may hold (quoted ones hold any byte).
bool PlainChar(char c) { return c >= 0x20 && c < 0x7f; }

// Reads a quoted scalar starting at text[0] (' or "), into `out`; `rest` is what
// follows the closing quote.
absl::Status Quoted(int line, absl::string_view text, std::string* out,
                    absl::string_view* rest) {
  const char quote = text[0];
  out->clear();
  for (size_t i = 1; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'' && c == '\'') {
      if (i + 1 < text.size() && text[i + 1] == '\'') {
        out->push_back('\'');
        ++i;
        continue;
      }
      *rest = text.substr(i + 1);
      return absl::OkStatus();
    }
    if (quote == '"' && c == '"') {
      *rest = text.substr(i + 1);
      return absl::OkStatus();
    }
    if (quote == '"' && c == '\\') {
      if (i + 1 >= text.size()) break;
      const char e = text[++i];
      switch (e) {
        case '\\':
        case '"':
        case '/':
          out->push_back(e);
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 't':
          out->push_back('\t');
          break;
        default:
          return Error(line, absl::StrCat("unsupported escape \\", std::string(1, e),
                                          " in a double-quoted scalar"));
      }
      continue;
    }
    out->push_back(c);
  }
  return Error(line,
               "quoted scalar not closed on its line (multi-line scalars are not "
               "supported)");
}

// What may follow a closing quote: spaces, then nothing or a comment.
absl::Status OnlyComment(int line, absl::string_view rest) {
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!rest.empty() && rest[0] != '#') {
    return Error(line, "unexpected text after a quoted scalar");
  }
  return absl::OkStatus();
}

// A plain scalar as a key or a value: no indicator at its start, no ": " or " #"
// inside (the caller has cut those), printable ASCII only.
absl::Status Plain(int line, absl::string_view text, absl::string_view what) {
  if (text.empty()) return Error(line, absl::StrCat("empty ", what));
  const char first = text[0];
  if (absl::string_view("-?:,[]{}#&*!|>'\"%@`").find(first) != absl::string_view::npos) {
    if (first == '-' && text.size() >= 2 && text[1] == ' ') {
      return Error(line, "sequences are not supported");
    }
    if (first != '-' || text.size() == 1) {
      return Error(line, absl::StrCat(what, " starts with '", std::string(1, first),
                                      "' (flow collections, anchors, aliases, tags "
                                      "and block scalars are not supported)"));
    }
  }
  for (char c : text) {
    if (!PlainChar(c)) {
      return Error(line, absl::StrCat(what,
                                      " holds a character outside printable "
                                      "ASCII (quote it? quoted scalars hold them)"));
    }
  }
  return absl::OkStatus();
}

// Cuts a content line (comments and trailing blanks removed) into its key and value.
absl::StatusOr<Line> Cut(int number, absl::string_view raw) {
  Line line{number, 0, "", false, ""};
  size_t indent = 0;
  while (indent < raw.size() && raw[indent] == ' ') ++indent;
  if (indent < raw.size() && raw[indent] == '\t') {
    return Error(number, "tab in indentation (use spaces)");
  }
  line.indent = static_cast<int>(indent);
  absl::string_view text = raw.substr(indent);
  // The key: quoted, or plain up to the first ':' followed by a space or the end.
  absl::string_view after;
  if (text[0] == '"' || text[0] == '\'') {
    absl::Status s = Quoted(number, text, &line.key, &after);
    if (!s.ok()) return s;
    if (after.empty() || after[0] != ':')
      return Error(number, "expected ':' after the key");
    if (line.key.empty()) return Error(number, "empty key");
  } else {
    size_t colon = 0;
    for (;; ++colon) {
      colon = text.find(':', colon);
      if (colon == absl::string_view::npos) {
        if (text == "---" || text == "...") {
          return Error(number, "document markers are not supported");
        }
        return Error(number, "expected 'key: value' or 'key:'");
      }
      if (colon + 1 == text.size() || text[colon + 1] == ' ') break;
    }
    const absl::string_view key =
        absl::StripTrailingAsciiWhitespace(text.substr(0, colon));
    absl::Status s = Plain(number, key, "key");
    if (!s.ok()) return s;
    line.key = std::string(key);
    after = text.substr(colon);
  }
  absl::string_view value = absl::StripAsciiWhitespace(after.substr(1));
  if (value.empty()) return line;
  line.has_value = true;
  if (value[0] == '"' || value[0] == '\'') {
    absl::string_view rest;
    absl::Status s = Quoted(number, value, &line.value, &rest);
    if (!s.ok()) return s;
    s = OnlyComment(number, rest);
    if (!s.ok()) return s;
    return line;
  }
  if (const size_t comment = value.find(" #"); comment != absl::string_view::npos) {
    value = absl::StripTrailingAsciiWhitespace(value.substr(0, comment));
  }
  absl::Status s = Plain(number, value, "value");
  if (!s.ok()) return s;
  if (value.find(": ") != absl::string_view::npos || absl::EndsWith(value, ":")) {
    return Error(number,
                 "a value holds ': ' (nested mappings go on their own lines; "
                 "quote a value that holds it)");
  }
  line.value = std::string(value);
  return line;
}

// The entries at `indent` from lines[*next] on, into `parent`.
absl::Status Block(const std::vector<Line>& lines, size_t* next, int indent, int depth,
                   YamlNode* parent) {
  if (depth > kMaxYamlDepth) {
    return Error(lines[*next].number,
                 absl::StrCat("nested deeper than ", kMaxYamlDepth, " levels"));
  }
  while (*next < lines.size()) {
    const Line& line = lines[*next];
    if (line.indent < indent) return absl::OkStatus();
    if (line.indent > indent) {
      return Error(line.number, "indented deeper than the key above it allows");
    }
    if (parent->Find(line.key) != nullptr) {
      return Error(line.number, absl::StrCat("duplicate key '", line.key, "'"));
    }
    YamlNode node;
    node.key = line.key;
    node.line = line.number;
    ++*next;
    const bool nested = *next < lines.size() && lines[*next].indent > indent;
    if (line.has_value) {
      if (nested) {
        return Error(lines[*next].number,
                     absl::StrCat("indented under '", line.key, "', which has a value"));
      }
      node.scalar = line.value;
    } else {
      node.is_mapping = true;
      if (nested) {
        absl::Status s = Block(lines, next, lines[*next].indent, depth + 1, &node);
        if (!s.ok()) return s;
        // A line between the two levels belongs to neither.
        if (*next < lines.size() && lines[*next].indent > indent) {
          return Error(lines[*next].number, "indentation matches no enclosing key");
        }
      }
    }
    parent->children.push_back(std::move(node));
  }
  return absl::OkStatus();
}

}  // namespace

const YamlNode* YamlNode::Find(absl::string_view name) const {
  for (const YamlNode& child : children) {
    if (child.key == name) return &child;
  }
  return nullptr;
}

absl::StatusOr<YamlNode> ParseYamlSubset(absl::string_view text) {
  if (text.size() > kMaxYamlBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("web config: ", text.size(), " bytes, more than ", kMaxYamlBytes));
  }
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    for (char c : raw) {
      if (c == '\t') continue;
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Error(number, "control character");
      }
    }
    const absl::string_view content = absl::StripAsciiWhitespace(raw);
    if (content.empty() || content[0] == '#') continue;
    absl::StatusOr<Line> line = Cut(number, absl::StripTrailingAsciiWhitespace(raw));
    if (!line.ok()) return line.status();
    lines.push_back(*std::move(line));
  }
  YamlNode root;
  root.is_mapping = true;
  if (lines.empty()) return root;
  if (lines[0].indent != 0) return Error(lines[0].number, "the first key is indented");
  size_t next = 0;
  absl::Status s = Block(lines, &next, 0, 1, &root);
  if (!s.ok()) return s;
  return root;
}

}  // namespace fuselink::services::http
