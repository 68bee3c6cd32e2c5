// The topology XML of xml.h: a small reader for the subset loom writes (first half), then the dialect on top of
// it (second half). No DTDs, namespaces, CDATA or text content: the dialect has no use for them, and a reader
// that refuses them with a line number is easier to trust than one that half-handles them.
#include "src/topology/xml.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace loom {
namespace {

struct XmlElement {
  std::string name;
  Attributes attrs;
  std::vector<XmlElement> children;
  int line = 0;
};

constexpr int kMaxDepth = 32;

bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool isNameChar(char c) { return isNameStart(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }
bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class XmlReader {
 public:
  explicit XmlReader(std::string_view text) : text_(text) {}

  bool document(XmlElement* root, std::string* error) {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // UTF-8 byte order mark
    if (!misc() || !element(root, 0)) return report(error);
    if (!misc()) return report(error);
    if (pos_ < text_.size()) {
      fail("unexpected content after the closing </" + root->name + ">");
      return report(error);
    }
    return true;
  }

 private:
  bool report(std::string* error) {
    *error = message_;
    return false;
  }
  bool fail(const std::string& what) {
    if (message_.empty()) message_ = "line " + std::to_string(lineAt(pos_)) + ": " + what;
    return false;
  }
  int lineAt(size_t pos) {
    for (; countedTo_ < pos && countedTo_ < text_.size(); ++countedTo_) line_ += text_[countedTo_] == '\n';
    return line_;
  }
  bool startsWith(std::string_view prefix) const { return text_.substr(pos_, prefix.size()) == prefix; }
  void skipSpace() {
    while (pos_ < text_.size() && isSpace(text_[pos_])) ++pos_;
  }
  // Whitespace, comments and processing instructions (<?xml ...?>) between elements.
  bool misc() {
    while (true) {
      skipSpace();
      if (startsWith("<!--")) {
        size_t end = text_.find("-->", pos_ + 4);
        if (end == std::string_view::npos) return fail("comment is not closed with -->");
        pos_ = end + 3;
      } else if (startsWith("<?")) {
        size_t end = text_.find("?>", pos_ + 2);
        if (end == std::string_view::npos) return fail("processing instruction is not closed with ?>");
        pos_ = end + 2;
      } else if (startsWith("<!")) {
        return fail("DOCTYPE and CDATA sections are not supported");
      } else {
        return true;
      }
    }
  }
  bool name(std::string* out, const char* what) {
    if (pos_ >= text_.size() || !isNameStart(text_[pos_])) {
      return fail(
          std::string("expected ") + what +
          (pos_ < text_.size() ? std::string(", found '") + text_[pos_] + "'" : ", found the end of the input"));
    }
    size_t start = pos_;
    while (pos_ < text_.size() && isNameChar(text_[pos_])) ++pos_;
    out->assign(text_.substr(start, pos_ - start));
    return true;
  }
  // Decodes one entity or character reference starting at '&'.
  bool entity(std::string* out) {
    size_t end = text_.find(';', pos_);
    if (end == std::string_view::npos || end - pos_ > 12) return fail("'&' does not start an entity such as &amp;");
    std::string_view ref = text_.substr(pos_ + 1, end - pos_ - 1);
    static const std::pair<std::string_view, char> kNamed[] = {
        {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    for (const auto& [entityName, value] : kNamed) {
      if (ref == entityName) {
        out->push_back(value);
        pos_ = end + 1;
        return true;
      }
    }
    if (ref.size() >= 2 && ref[0] == '#') {
      bool hex = ref[1] == 'x';
      std::string_view digits = ref.substr(hex ? 2 : 1);
      unsigned code = 0;
      auto [stop, error] = std::from_chars(digits.data(), digits.data() + digits.size(), code, hex ? 16 : 10);
      if (error == std::errc() && stop == digits.data() + digits.size() && !digits.empty() && code > 0 && code < 0x80) {
        out->push_back(static_cast<char>(code));
        pos_ = end + 1;
        return true;
      }
      return fail("character reference &" + std::string(ref) + "; is not an ASCII character (1-127)");
    }
    return fail("unknown entity &" + std::string(ref) + ";");
  }
  bool attributeValue(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\'')) return fail("expected a quoted value");
    char quote = text_[pos_++];
    while (true) {
      if (pos_ >= text_.size()) return fail("attribute value is not closed");
      char c = text_[pos_];
      if (c == quote) break;
      if (c == '<') return fail("'<' inside an attribute value (write &lt;)");
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
        return fail("control character " + std::to_string(static_cast<int>(c)) + " inside an attribute value");
      if (c == '&') {
        if (!entity(out)) return false;
        continue;
      }
      out->push_back(c);
      ++pos_;
    }
    ++pos_;
    return true;
  }
  bool element(XmlElement* out, int depth) {
    if (depth > kMaxDepth) return fail("elements nest deeper than " + std::to_string(kMaxDepth));
    if (!startsWith("<")) {
      return fail(pos_ < text_.size() ? "expected an element, found text"
                                      : "expected an element, found the end of the input");
    }
    out->line = lineAt(pos_);
    ++pos_;
    if (!name(&out->name, "an element name")) return false;
    while (true) {
      size_t before = pos_;
      skipSpace();
      if (startsWith("/>")) {
        pos_ += 2;
        return true;
      }
      if (startsWith(">")) {
        ++pos_;
        break;
      }
      if (pos_ == before) return fail("expected whitespace, '>' or '/>' after <" + out->name);
      std::string key, value;
      if (!name(&key, "an attribute name")) return false;
      skipSpace();
      if (!startsWith("=")) return fail("expected '=' after attribute " + key);
      ++pos_;
      skipSpace();
      if (!attributeValue(&value)) return false;
      if (findAttribute(out->attrs, key) != nullptr)
        return fail("attribute " + key + " appears twice in <" + out->name + ">");
      out->attrs.emplace_back(std::move(key), std::move(value));
    }
    while (true) {
      if (!misc()) return false;
      if (pos_ >= text_.size())
        return fail("<" + out->name + "> (line " + std::to_string(out->line) + ") is not closed");
      if (startsWith("</")) {
        pos_ += 2;
        std::string closing;
        if (!name(&closing, "an element name after </")) return false;
        if (closing != out->name)
          return fail("</" + closing + "> closes <" + out->name + "> opened on line " + std::to_string(out->line));
        skipSpace();
        if (!startsWith(">")) return fail("expected '>' after </" + closing);
        ++pos_;
        return true;
      }
      if (!startsWith("<")) {
        size_t end = pos_;
        while (end < text_.size() && text_[end] != '<' && text_[end] != '\n' && end - pos_ < 20) ++end;
        return fail("unexpected text \"" + std::string(text_.substr(pos_, end - pos_)) + "\" inside <" + out->name +
                    ">");
      }
      out->children.emplace_back();
      if (!element(&out->children.back(), depth + 1)) return false;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  size_t countedTo_ = 0;
  int line_ = 1;
  std::string message_;
};

// --- Writing.

std::string number(double value) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return error == std::errc() ? std::string(buffer, end) : std::string("nan");
}

void appendEscaped(std::string* out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '&':
        *out += "&amp;";
        break;
      case '<':
        *out += "&lt;";
        break;
      case '>':
        *out += "&gt;";
        break;
      case '"':
        *out += "&quot;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          *out += "&#" + std::to_string(static_cast<int>(c)) + ";";
        else
          out->push_back(c);
    }
  }
}

void appendAttribute(std::string* out, std::string_view key, std::string_view value) {
  *out += ' ';
  *out += key;
  *out += "=\"";
  appendEscaped(out, value);
  *out += '"';
}

// --- Reading the dialect.

class DialectReader {
 public:
  DialectReader(Topology* topo, std::string* error) : topo_(topo), error_(error) {}

  bool read(const XmlElement& root) {
    if (root.name != "topology") return fail(root, "the root element is <" + root.name + ">, expected <topology>");
    const std::string* version = findAttribute(root.attrs, "version");
    if (version == nullptr) return fail(root, "<topology> has no version attribute (this loom reads version=\"1\")");
    if (*version != "1")
      return fail(root, "<topology> version \"" + *version + "\" is not supported (this loom reads version=\"1\")");
    for (const auto& [key, value] : root.attrs)
      if (key != "version") topo_->attributes().emplace_back(key, value);
    // Nodes first, so that links and ranks may name nodes defined anywhere in the file.
    for (const XmlElement& child : root.children) {
      if (child.name == "node") {
        if (!node(child)) return false;
      } else if (child.name != "link" && child.name != "rank") {
        return fail(child, "unknown element <" + child.name + "> (expected node, link or rank)");
      }
    }
    for (size_t id = 0; id < nodeLines_.size(); ++id) {
      const TopoNode& node = topo_->node(static_cast<int>(id));
      if (node.host < -1 || node.host >= topo_->hostCount()) {
        return failAt(nodeLines_[id], "node \"" + node.name + "\" has host=\"" + std::to_string(node.host) +
                                          "\", but the file has " + std::to_string(topo_->hostCount()) + " host nodes");
      }
      if (node.host == -1 && node.kind != NodeKind::kNetSwitch && node.kind != NodeKind::kNvSwitch) {
        return failAt(nodeLines_[id], "node \"" + node.name + "\" of kind " + nodeKindName(node.kind) +
                                          " needs a host (only switches may have host=\"-1\")");
      }
      if (node.kind == NodeKind::kNetSwitch && node.host != -1)
        return failAt(nodeLines_[id], "network switch \"" + node.name + "\" must have host=\"-1\"");
    }
    for (const XmlElement& child : root.children) {
      if (child.name == "link" && !link(child)) return false;
      if (child.name == "rank" && !rank(child)) return false;
    }
    std::string problem = topo_->validate();
    if (!problem.empty()) return fail(root, "invalid topology: " + problem);
    return true;
  }

 private:
  bool failAt(int line, const std::string& what) {
    *error_ = "line " + std::to_string(line) + ": " + what;
    return false;
  }
  bool fail(const XmlElement& element, const std::string& what) { return failAt(element.line, what); }

  bool required(const XmlElement& element, const char* key, const std::string** value) {
    *value = findAttribute(element.attrs, key);
    if (*value == nullptr) return fail(element, "<" + element.name + "> has no " + key + " attribute");
    return true;
  }
  bool integer(const XmlElement& element, const char* key, const std::string& text, int* value) {
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
    if (error != std::errc() || end != text.data() + text.size() || text.empty())
      return fail(element, "<" + element.name + "> " + key + "=\"" + text + "\" is not an integer");
    return true;
  }
  bool real(const XmlElement& element, const char* key, const std::string& text, double* value) {
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
    if (error != std::errc() || end != text.data() + text.size() || text.empty())
      return fail(element, "<" + element.name + "> " + key + "=\"" + text + "\" is not a number");
    return true;
  }
  bool noChildren(const XmlElement& element) {
    if (!element.children.empty())
      return fail(element.children.front(),
                  "<" + element.name + "> may not contain <" + element.children.front().name + ">");
    return true;
  }
  bool onlyKeys(const XmlElement& element, std::initializer_list<std::string_view> keys) {
    for (const auto& [key, value] : element.attrs) {
      bool known = false;
      for (std::string_view allowed : keys) known |= key == allowed;
      if (!known) return fail(element, "<" + element.name + "> has an unknown attribute " + key);
    }
    return true;
  }
  int nodeNamed(const XmlElement& element, const char* key, const std::string& name) {
    int id = topo_->findNode(name);
    if (id < 0) fail(element, "<" + element.name + "> " + key + "=\"" + name + "\" names no node");
    return id;
  }

  bool node(const XmlElement& element) {
    const std::string *name, *kindName, *hostText;
    if (!noChildren(element) || !required(element, "name", &name) || !required(element, "kind", &kindName) ||
        !required(element, "host", &hostText))
      return false;
    NodeKind kind;
    if (!parseNodeKind(*kindName, &kind)) {
      return fail(element, "node \"" + *name + "\" has unknown kind \"" + *kindName +
                               "\" (host, numa, pciswitch, gpu, nvswitch, nic, netswitch)");
    }
    int host = 0;
    if (!integer(element, "host", *hostText, &host)) return false;
    if (name->empty()) return fail(element, "<node> has an empty name");
    int previous = topo_->findNode(*name);
    if (previous >= 0) {
      return fail(element, "node name \"" + *name + "\" is used twice (first on line " +
                               std::to_string(nodeLines_[previous]) + ")");
    }
    Attributes attrs;
    for (const auto& [key, value] : element.attrs)
      if (key != "name" && key != "kind" && key != "host") attrs.emplace_back(key, value);
    if (kind == NodeKind::kHost) {
      if (host != topo_->hostCount()) {
        return fail(element, "host node \"" + *name + "\" has host=\"" + *hostText +
                                 "\"; host nodes must be numbered 0, 1, ... in file order (expected " +
                                 std::to_string(topo_->hostCount()) + ")");
      }
      topo_->addHost(*name, std::move(attrs));
    } else {
      topo_->addNode(kind, *name, host, std::move(attrs));
    }
    nodeLines_.push_back(element.line);
    return true;
  }

  bool link(const XmlElement& element) {
    const std::string *kindName, *from, *to, *bw, *lat;
    if (!noChildren(element) || !onlyKeys(element, {"kind", "from", "to", "bw", "lat"}) ||
        !required(element, "kind", &kindName) || !required(element, "from", &from) || !required(element, "to", &to) ||
        !required(element, "bw", &bw) || !required(element, "lat", &lat))
      return false;
    LinkKind kind;
    if (!parseLinkKind(*kindName, &kind))
      return fail(element, "link has unknown kind \"" + *kindName + "\" (nvlink, pcie, shm, smp, network)");
    double bandwidth = 0, latency = 0;
    if (!real(element, "bw", *bw, &bandwidth) || !real(element, "lat", *lat, &latency)) return false;
    if (!(bandwidth > 0) || !std::isfinite(bandwidth))
      return fail(element, "link bw=\"" + *bw + "\" is not a positive bandwidth in GB/s");
    if (!(latency >= 0) || !std::isfinite(latency))
      return fail(element, "link lat=\"" + *lat + "\" is not a latency >= 0 in microseconds");
    int a = nodeNamed(element, "from", *from);
    if (a < 0) return false;
    int b = nodeNamed(element, "to", *to);
    if (b < 0) return false;
    if ((a == b) != (kind == LinkKind::kSharedMemory)) {
      return fail(element, a == b ? "a " + *kindName + " link joins \"" + *from + "\" to itself (only shm links may)"
                                  : "an shm link must join a node to itself, not \"" + *from + "\" to \"" + *to + "\"");
    }
    topo_->addLink(kind, a, b, bandwidth, latency);
    return true;
  }

  bool rank(const XmlElement& element) {
    const std::string *idText, *nodeName;
    if (!noChildren(element) || !onlyKeys(element, {"id", "node", "nic"}) || !required(element, "id", &idText) ||
        !required(element, "node", &nodeName))
      return false;
    int id = 0;
    if (!integer(element, "id", *idText, &id)) return false;
    if (id < 0 || id > (1 << 24)) return fail(element, "rank id " + *idText + " is out of range (0 to 16777216)");
    if (topo_->rankNode(id) >= 0) return fail(element, "rank " + *idText + " is placed twice");
    int node = nodeNamed(element, "node", *nodeName);
    if (node < 0) return false;
    topo_->mapRank(id, node);
    for (const auto& [key, value] : element.attrs)
      if (key == "nic") topo_->setRankNic(id, value);
    return true;
  }

  Topology* topo_;
  std::string* error_;
  std::vector<int> nodeLines_;  // the line of each node, by id
};

}  // namespace

std::string topologyToXml(const Topology& topo) {
  std::string out;
  out.reserve(static_cast<size_t>(topo.nodeCount()) * 90 + static_cast<size_t>(topo.linkCount()) * 90 + 256);
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<!-- loom topology (docs/TOPOLOGY.md): bw in GB/s per direction, lat in microseconds -->\n";
  out += "<topology";
  appendAttribute(&out, "version", "1");
  for (const auto& [key, value] : topo.attributes()) appendAttribute(&out, key, value);
  out += ">\n";
  for (const TopoNode& node : topo.nodes()) {
    out += "  <node";
    appendAttribute(&out, "name", node.name);
    appendAttribute(&out, "kind", nodeKindName(node.kind));
    appendAttribute(&out, "host", std::to_string(node.host));
    for (const auto& [key, value] : node.attrs) appendAttribute(&out, key, value);
    out += "/>\n";
  }
  for (const TopoLink& link : topo.links()) {
    out += "  <link";
    appendAttribute(&out, "kind", linkKindName(link.kind));
    appendAttribute(&out, "from", topo.node(link.a).name);
    appendAttribute(&out, "to", topo.node(link.b).name);
    appendAttribute(&out, "bw", number(link.bandwidth));
    appendAttribute(&out, "lat", number(link.latency));
    out += "/>\n";
  }
  for (int rank = 0; rank < topo.rankCount(); ++rank) {
    if (topo.rankNode(rank) < 0) continue;
    out += "  <rank";
    appendAttribute(&out, "id", std::to_string(rank));
    appendAttribute(&out, "node", topo.node(topo.rankNode(rank)).name);
    if (!topo.rankNicDevice(rank).empty()) appendAttribute(&out, "nic", topo.rankNicDevice(rank));
    out += "/>\n";
  }
  out += "</topology>\n";
  return out;
}

bool parseTopologyXml(std::string_view text, Topology* topo, std::string* error) {
  XmlElement root;
  XmlReader reader(text);
  if (!reader.document(&root, error)) return false;
  Topology parsed;
  DialectReader dialect(&parsed, error);
  if (!dialect.read(root)) return false;
  *topo = std::move(parsed);
  return true;
}

bool readTopologyFile(const std::string& path, Topology* topo, std::string* error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  std::stringstream text;
  text << file.rdbuf();
  if (file.bad()) {
    *error = path + ": read failed";
    return false;
  }
  if (!parseTopologyXml(text.str(), topo, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

bool writeTopologyFile(const std::string& path, const Topology& topo, std::string* error) {
  std::string temporary = path + ".tmp." + std::to_string(getpid());
  std::string text = topologyToXml(topo);
  FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) {
    *error = temporary + ": cannot create: " + std::strerror(errno);
    return false;
  }
  bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  int savedErrno = errno;
  if (std::fclose(file) != 0 && written) {
    written = false;
    savedErrno = errno;
  }
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    if (written) savedErrno = errno;
    std::remove(temporary.c_str());
    *error = path + ": cannot write: " + std::strerror(savedErrno);
    return false;
  }
  return true;
}

}  // namespace loom
