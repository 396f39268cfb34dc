#include "ferry/cluster.h"

#include <charconv>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include <arpa/inet.h>

#include <nlohmann/json.hpp>

namespace ferry {
namespace {

using nlohmann::json;

Status Bad(const std::string& where, const std::string& what) {
  return InvalidArgumentError("TF_CONFIG: " + where + ": " + what);
}

// The host of "host:port" or "tcp://host:port" (checked by PortOf first).
std::string HostOf(std::string_view address) {
  if (address.starts_with("tcp://")) address.remove_prefix(6);
  return std::string(address.substr(0, address.rfind(':')));
}

// "host:port" or "tcp://host:port" -> the port; the host must be non-empty.
StatusOr<int> PortOf(const std::string& where, std::string_view address) {
  std::string_view a = address;
  if (a.starts_with("tcp://")) a.remove_prefix(6);
  // Built with append: GCC 12 warns (-Wrestrict, a false positive) on "'" + string + "...".
  std::string quoted(1, '\'');
  quoted.append(address).append("' has no ");
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos) return Bad(where, quoted + "port (host:port)");
  if (colon == 0) return Bad(where, quoted + "host (host:port)");
  const std::string_view p = a.substr(colon + 1);
  int port = 0;
  const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  if (ec != std::errc() || ptr != p.data() + p.size() || port < 1 || port > 65535) {
    return Bad(where, quoted + "port in [1, 65535]");
  }
  return port;
}

// cluster.<name>: a list of "host:port" strings; absent means empty.
StatusOr<std::vector<std::string>> List(const json& cluster, const std::string& name) {
  std::vector<std::string> out;
  auto it = cluster.find(name);
  if (it == cluster.end()) return out;
  if (!it->is_array()) return Bad("cluster." + name, "is not a list of \"host:port\" strings");
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string where = "cluster." + name + "[" + std::to_string(i) + "]";
    const json& e = (*it)[i];
    if (!e.is_string()) return Bad(where, "is not a \"host:port\" string");
    FERRY_RETURN_IF_ERROR(PortOf(where, e.get<std::string>()).status());
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

StatusOr<ClusterConfig> ParseTfConfig(std::string_view text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(std::string("TF_CONFIG is not JSON: ") + e.what());
  }
  if (!root.is_object()) return InvalidArgumentError("TF_CONFIG is not a JSON object");
  auto cluster = root.find("cluster");
  if (cluster == root.end() || !cluster->is_object()) return Bad("cluster", "missing, or not an object");
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> ps, List(*cluster, "ps"));
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> chief, List(*cluster, "chief"));
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> worker, List(*cluster, "worker"));
  if (ps.empty()) return Bad("cluster.ps", "no parameter servers listed (Ferry needs at least one)");
  if (chief.size() > 1) return Bad("cluster.chief", "lists " + std::to_string(chief.size()) + " tasks; at most one");
  if (chief.empty() && worker.empty()) return Bad("cluster", "no \"chief\" or \"worker\" tasks listed");
  // Every task has its own address: two tasks at one "host:port" (a copy-paste slip) would make
  // two servers bind one port, or a worker dial a server as another.
  std::map<std::string, std::string> seen;  // address (without tcp://) -> where it was listed
  for (const auto& [name, list] : {std::pair{"ps", &ps}, std::pair{"chief", &chief}, std::pair{"worker", &worker}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string& entry = (*list)[i];
      const std::string address = entry.starts_with("tcp://") ? entry.substr(6) : entry;
      const std::string where = std::string("cluster.") + name + "[" + std::to_string(i) + "]";
      const auto [it, added] = seen.emplace(address, where);
      if (!added) return Bad(where, "'" + entry + "' is listed twice (also " + it->second + "): each task has its own");
    }
  }
  for (auto& [key, value] : cluster->items()) {
    if (key == "evaluator")
      return Bad("cluster.evaluator", "Ferry has no evaluator task (workers evaluate: --eval-every)");
    if (key != "ps" && key != "chief" && key != "worker") return Bad("cluster." + key, "unknown task type");
  }

  auto task = root.find("task");
  if (task == root.end() || !task->is_object()) return Bad("task", "missing, or not an object");
  auto type = task->find("type");
  if (type == task->end() || !type->is_string()) return Bad("task.type", "missing, or not a string");
  auto index = task->find("index");
  if (index == task->end() || !index->is_number_integer()) return Bad("task.index", "missing, or not an integer");

  ClusterConfig c;
  c.task_type = type->get<std::string>();
  const int64_t i = index->get<int64_t>();
  const std::vector<std::string>* own = nullptr;
  if (c.task_type == "ps") {
    own = &ps;
  } else if (c.task_type == "chief") {
    own = &chief;
  } else if (c.task_type == "worker") {
    own = &worker;
  } else {
    return Bad("task.type", "'" + c.task_type + "' is not one of ps, chief, worker");
  }
  if (i < 0 || i >= static_cast<int64_t>(own->size())) {
    return Bad("task.index", std::to_string(i) + " is outside cluster." + c.task_type + " (" +
                                 std::to_string(own->size()) + " entries)");
  }
  c.task_index = static_cast<int>(i);
  for (const auto& s : ps) c.servers.push_back(s.starts_with("tcp://") ? s : "tcp://" + s);
  c.num_workers = static_cast<int>(chief.size() + worker.size());
  if (c.task_type == "ps") {
    c.rank = c.task_index;
    FERRY_ASSIGN_OR_RETURN(int port, PortOf("cluster.ps", ps[static_cast<size_t>(i)]));
    const std::string host = HostOf(ps[static_cast<size_t>(i)]);
    in_addr ip{};
    c.bind = "tcp://" + (inet_pton(AF_INET, host.c_str(), &ip) == 1 ? host : "0.0.0.0") + ":" + std::to_string(port);
  } else {
    c.rank = c.task_type == "chief" ? 0 : c.task_index + static_cast<int>(chief.size());
  }
  return c;
}

StatusOr<std::optional<ClusterConfig>> ClusterFromEnvironment() {
  const char* v = std::getenv("TF_CONFIG");
  if (v == nullptr || *v == '\0') return std::optional<ClusterConfig>();
  FERRY_ASSIGN_OR_RETURN(ClusterConfig c, ParseTfConfig(v));
  return std::optional<ClusterConfig>(std::move(c));
}

}  // namespace ferry
