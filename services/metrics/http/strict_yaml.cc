#include "services/metrics/http/strict_yaml.h"

#include <yaml.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fuselink::services::http {
namespace {

static_assert(kMaxYamlDepth >= 3, "a web config nests three levels");

absl::Status Error(size_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("web config line ", line, ": ", what));
}

size_t LineOf(const yaml_mark_t& mark) { return mark.line + 1; }

// The number of the last line, counted as libyaml counts: YAML 1.1 also breaks lines
// at NEL, LS and PS (a lone CR never reaches libyaml).
size_t LastLine(absl::string_view text) {
  size_t lines = 1 + std::count(text.begin(), text.end(), '\n');
  for (absl::string_view other : {"\xc2\x85", "\xe2\x80\xa8", "\xe2\x80\xa9"}) {
    for (size_t at = text.find(other); at != absl::string_view::npos;
         at = text.find(other, at + 1)) {
      ++lines;
    }
  }
  return lines;
}

// libyaml's parser and the event it last produced. Not copyable; one per parse.
class Events {
 public:
  explicit Events(absl::string_view text) : text_(text) {
    initialized_ = yaml_parser_initialize(&parser_) != 0;
    if (initialized_) {
      yaml_parser_set_input_string(
          &parser_, reinterpret_cast<const unsigned char*>(text.data()), text.size());
      yaml_parser_set_encoding(&parser_, YAML_UTF8_ENCODING);
    }
  }
  ~Events() {
    if (has_event_) yaml_event_delete(&event_);
    if (initialized_) yaml_parser_delete(&parser_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;

  // Moves to the next event; libyaml's error, with its line, when there is none.
  absl::Status Next() {
    if (!initialized_) {
      return absl::ResourceExhaustedError("web config: libyaml cannot allocate");
    }
    if (has_event_) yaml_event_delete(&event_);
    has_event_ = yaml_parser_parse(&parser_, &event_) != 0;
    return has_event_ ? absl::OkStatus() : ParserError();
  }
  const yaml_event_t& event() const { return event_; }
  size_t line() const { return LineOf(event_.start_mark); }

 private:
  absl::Status ParserError() const {
    if (parser_.error == YAML_MEMORY_ERROR) {
      return absl::ResourceExhaustedError("web config: libyaml ran out of memory");
    }
    // At the end of a text without a final newline, libyaml's marks stand on the
    // line after the last: the last is named instead.
    const size_t last = LastLine(text_);
    size_t line = std::min(LineOf(parser_.problem_mark), last);
    if (parser_.error == YAML_READER_ERROR) {  // marks a byte offset, not a line
      line = LastLine(text_.substr(0, parser_.problem_offset));
    }
    std::string what = parser_.problem != nullptr ? parser_.problem : "unreadable YAML";
    if (parser_.context != nullptr) {
      absl::StrAppend(&what, " (", parser_.context, " from line ",
                      std::min(LineOf(parser_.context_mark), last), ")");
    }
    return Error(line, what);
  }

  const absl::string_view text_;
  yaml_parser_t parser_{};
  yaml_event_t event_{};
  bool initialized_ = false;
  bool has_event_ = false;
};

absl::Status Unsupported(size_t line, absl::string_view what, char first) {
  return Error(line, absl::StrCat(what, " starts with '", std::string(1, first),
                                  "' (flow collections, anchors, aliases, tags "
                                  "and block scalars are not supported)"));
}

// An anchor or tag on a node, or an alias for one: YAML's ways of making a node
// mean another's value or another type.
absl::Status NoAnchorOrTag(size_t line, absl::string_view what, const yaml_char_t* anchor,
                           const yaml_char_t* tag) {
  if (anchor != nullptr) return Unsupported(line, what, '&');
  if (tag != nullptr) return Unsupported(line, what, '!');
  return absl::OkStatus();
}

// A scalar over several lines. YAML folds the lines of a plain scalar into one, so
// that a line indented under `key: value` silently extends the value: refused there.
absl::Status MultiLine(const yaml_event_t& e, absl::string_view key) {
  if (e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
    return Error(LineOf(e.end_mark),
                 absl::StrCat("indented under '", key, "', which has a value"));
  }
  return Error(LineOf(e.start_mark),
               "quoted scalar not closed on its line (multi-line scalars are not "
               "supported)");
}

// A node that is not a block mapping or a one-line scalar; OK for those two. `what`
// names the node's place ("key", "value"); `key` is the key of a value.
absl::Status Refused(const Events& events, absl::string_view what,
                     absl::string_view key = "") {
  const yaml_event_t& e = events.event();
  switch (e.type) {
    case YAML_ALIAS_EVENT:
      return Unsupported(events.line(), what, '*');
    case YAML_SEQUENCE_START_EVENT:
      if (e.data.sequence_start.style == YAML_FLOW_SEQUENCE_STYLE) {
        return Unsupported(events.line(), what, '[');
      }
      return Error(events.line(), "sequences are not supported");
    case YAML_MAPPING_START_EVENT:
      if (e.data.mapping_start.style == YAML_FLOW_MAPPING_STYLE) {
        return Unsupported(events.line(), what, '{');
      }
      return NoAnchorOrTag(events.line(), what, e.data.mapping_start.anchor,
                           e.data.mapping_start.tag);
    case YAML_SCALAR_EVENT: {
      const auto& s = e.data.scalar;
      if (absl::Status st = NoAnchorOrTag(events.line(), what, s.anchor, s.tag);
          !st.ok()) {
        return st;
      }
      if (s.style == YAML_LITERAL_SCALAR_STYLE)
        return Unsupported(events.line(), what, '|');
      if (s.style == YAML_FOLDED_SCALAR_STYLE)
        return Unsupported(events.line(), what, '>');
      if (e.end_mark.line != e.start_mark.line) return MultiLine(e, key);
      if (s.style != YAML_PLAIN_SCALAR_STYLE) return absl::OkStatus();
      // Outside quotes, printable ASCII only: what a reader sees is what it means.
      const absl::string_view value(reinterpret_cast<const char*>(s.value), s.length);
      for (const unsigned char c : value) {
        if (c < 0x20 || c >= 0x7f) {
          return Error(events.line(), absl::StrCat(what,
                                                   " holds a character outside "
                                                   "printable ASCII (quote it? quoted "
                                                   "scalars hold them)"));
        }
      }
      return absl::OkStatus();
    }
    default:
      return Error(events.line(), absl::StrCat("unexpected YAML event ", e.type));
  }
}

std::string ScalarOf(const yaml_event_t& e) {
  return std::string(reinterpret_cast<const char*>(e.data.scalar.value),
                     e.data.scalar.length);
}

// The entries of the block mapping whose start is the current event, into `parent`;
// `depth` counts it (the top level is 1). Recursion is bounded by kMaxYamlDepth.
absl::Status Mapping(Events& events, int depth, YamlNode* parent) {
  if (depth > kMaxYamlDepth) {
    return Error(events.line(),
                 absl::StrCat("nested deeper than ", kMaxYamlDepth, " levels"));
  }
  for (;;) {
    if (absl::Status s = events.Next(); !s.ok()) return s;
    if (events.event().type == YAML_MAPPING_END_EVENT) return absl::OkStatus();
    if (absl::Status s = Refused(events, "key"); !s.ok()) return s;
    if (events.event().type != YAML_SCALAR_EVENT) {
      return Error(events.line(), "a key must be a scalar");
    }
    YamlNode node;
    node.key = ScalarOf(events.event());
    node.line = static_cast<int>(events.line());
    if (node.key.empty()) return Error(events.line(), "empty key");
    if (depth == 1 && parent->children.empty() && events.event().start_mark.column != 0) {
      return Error(events.line(), "the first key is indented");
    }
    if (parent->Find(node.key) != nullptr) {
      return Error(events.line(), absl::StrCat("duplicate key '", node.key, "'"));
    }
    if (absl::Status s = events.Next(); !s.ok()) return s;
    if (absl::Status s = Refused(events, "value", node.key); !s.ok()) return s;
    const yaml_event_t& value = events.event();
    if (value.type == YAML_MAPPING_START_EVENT) {
      node.is_mapping = true;
      if (absl::Status s = Mapping(events, depth + 1, &node); !s.ok()) return s;
    } else if (value.data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
               value.data.scalar.length == 0) {
      node.is_mapping = true;  // `key:` and nothing: an empty mapping
    } else {
      node.scalar = ScalarOf(value);
    }
    parent->children.push_back(std::move(node));
  }
}

// Control characters, and tabs before a line's first character other than a space
// (libyaml refuses those, even on blank lines; here with a hint), checked before
// libyaml sees the text. Other tabs and the CR of a CRLF pass.
absl::Status NoControlCharacters(absl::string_view text) {
  size_t line = 1;
  bool indenting = true;  // only spaces so far on this line
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      indenting = true;
      continue;
    }
    if (c == '\t' && indenting) return Error(line, "tab in indentation (use spaces)");
    indenting = indenting && c == ' ';
    if (c == '\r' && (i + 1 == text.size() || text[i + 1] == '\n')) continue;
    if (c != '\t' && (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)) {
      return Error(line, "control character");
    }
  }
  return absl::OkStatus();
}

// One implicit document holding a block mapping, or nothing.
absl::Status Document(Events& events, YamlNode* root) {
  const yaml_event_t& start = events.event();
  if (start.data.document_start.version_directive != nullptr ||
      start.data.document_start.tag_directives.start !=
          start.data.document_start.tag_directives.end) {
    return Error(events.line(), "directives are not supported");
  }
  if (!start.data.document_start.implicit) {
    return Error(events.line(), "document markers are not supported");
  }
  if (absl::Status s = events.Next(); !s.ok()) return s;
  if (absl::Status s = Refused(events, "value"); !s.ok()) return s;
  if (events.event().type != YAML_MAPPING_START_EVENT) {
    return Error(events.line(), "expected 'key: value' or 'key:'");
  }
  if (absl::Status s = Mapping(events, 1, root); !s.ok()) return s;
  if (absl::Status s = events.Next(); !s.ok()) return s;
  if (!events.event().data.document_end.implicit) {
    return Error(events.line(), "document markers are not supported");
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

absl::StatusOr<YamlNode> ParseStrictYaml(absl::string_view text) {
  if (text.size() > kMaxYamlBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("web config: ", text.size(), " bytes, more than ", kMaxYamlBytes));
  }
  if (absl::Status s = NoControlCharacters(text); !s.ok()) return s;
  YamlNode root;
  root.is_mapping = true;
  Events events(text);
  if (absl::Status s = events.Next(); !s.ok()) return s;  // the stream's start
  if (absl::Status s = events.Next(); !s.ok()) return s;
  if (events.event().type == YAML_STREAM_END_EVENT) return root;  // comments at most
  if (absl::Status s = Document(events, &root); !s.ok()) return s;
  if (absl::Status s = events.Next(); !s.ok()) return s;
  if (events.event().type != YAML_STREAM_END_EVENT) {
    return Error(events.line(), "document markers are not supported");
  }
  return root;
}

}  // namespace fuselink::services::http
