// ferry/cluster.h — a Ferry cluster described by TensorFlow's TF_CONFIG environment variable,
// as Kubeflow's TFJob (and other launchers written for TensorFlow) set it in every process:
//
//   {"cluster": {"ps": ["ps-0:2222", "ps-1:2222"], "chief": ["chief-0:2222"],
//                "worker": ["worker-0:2222", "worker-1:2222"]},
//    "task": {"type": "worker", "index": 1}}
//
// Ferry's servers are the "ps" list, in order. Its workers are the "chief" (if any) followed by
// the "worker" list: the chief is worker rank 0 and "worker" index i is rank i + 1 (i without a
// chief). A worker's own address is not used (Ferry workers do not listen). A server whose entry
// is an IPv4 address listens on that address; one whose entry is a name listens on every
// interface at the entry's port, since the name (a Kubernetes service) usually resolves to an
// address the pod cannot bind. "evaluator" tasks are refused: Ferry's workers evaluate
// themselves (--eval-every).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry {

struct ClusterConfig {
  std::vector<std::string> servers;  // tcp://host:port, in "ps" order
  int num_workers = 0;               // chief + worker entries
  std::string task_type;             // "ps", "chief" or "worker"
  int task_index = 0;                // the task's index in its own list
  int rank = 0;                      // ps: the server rank; chief / worker: the worker rank
  std::string bind;                  // ps: tcp://IP:PORT or tcp://0.0.0.0:PORT (see above); else empty
};

// Parses a TF_CONFIG value. Every error says what is wrong and where ("TF_CONFIG: cluster.ps[1]:
// 'ps-1' has no port").
StatusOr<ClusterConfig> ParseTfConfig(std::string_view json);

// The cluster from the TF_CONFIG environment variable; nullopt when it is unset or empty.
StatusOr<std::optional<ClusterConfig>> ClusterFromEnvironment();

}  // namespace ferry
