// deploy/k8s/dtrain-job.yaml parses as Kubernetes YAML (several documents) and says what the
// launcher relies on: an Indexed Job whose pod count is --nnodes, pod 0 reachable as
// --master-addr through the headless Service (both ports), the token from the Secret its header
// makes, the output folder on the PVC, the config from the ConfigMap (a valid dtrain config), the
// requeue exit code ignored by the pod failure policy.
#include <doctest/doctest.h>

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "launch/node_env.h"
#include "util/fs.h"

using namespace dtrain;

namespace {

const std::string kManifest = std::string(DTRAIN_SOURCE_DIR) + "/deploy/k8s/dtrain-job.yaml";

// The one document of `kind`.
YAML::Node of_kind(const std::vector<YAML::Node>& docs, const std::string& kind) {
  YAML::Node found;
  int n = 0;
  for (const YAML::Node& d : docs)
    if (d["kind"] && d["kind"].as<std::string>() == kind) {
      found = d;
      ++n;
    }
  REQUIRE_MESSAGE(n == 1, "documents of kind ", kind, ": ", n);
  return found;
}

// The value after `flag` in a command line ("" when absent).
std::string flag_value(const std::vector<std::string>& cmd, const std::string& flag) {
  for (size_t i = 0; i + 1 < cmd.size(); ++i)
    if (cmd[i] == flag) return cmd[i + 1];
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

TEST_CASE("deploy/k8s/dtrain-job.yaml: the fields dtrain launch relies on") {
  const std::vector<YAML::Node> docs = YAML::LoadAllFromFile(kManifest);
  REQUIRE(docs.size() == 4);
  for (const YAML::Node& d : docs) {
    REQUIRE(d["apiVersion"]);
    REQUIRE(d["metadata"]["name"]);
  }
  const YAML::Node pvc = of_kind(docs, "PersistentVolumeClaim");
  const YAML::Node cm = of_kind(docs, "ConfigMap");
  const YAML::Node svc = of_kind(docs, "Service");
  const YAML::Node job = of_kind(docs, "Job");
  CHECK(job["apiVersion"].as<std::string>() == "batch/v1");
  for (const YAML::Node& d : {pvc, cm, svc}) CHECK(d["apiVersion"].as<std::string>() == "v1");

  // The Indexed Job: one pod per node, never restarted by the kubelet (the launchers restart
  // the job themselves, all nodes together).
  const YAML::Node spec = job["spec"];
  CHECK(spec["completionMode"].as<std::string>() == "Indexed");
  const YAML::Node pod = spec["template"]["spec"];
  CHECK(pod["restartPolicy"].as<std::string>() == "Never");
  REQUIRE(pod["containers"].size() == 1);
  const YAML::Node c = pod["containers"][0];
  const auto cmd = c["command"].as<std::vector<std::string>>();
  REQUIRE(cmd.size() >= 3);
  CHECK(cmd[1] == "launch");
  const int nnodes = std::stoi(flag_value(cmd, "--nnodes"));
  CHECK(spec["completions"].as<int>() == nnodes);
  CHECK(spec["parallelism"].as<int>() == nnodes);
  CHECK(flag_value(cmd, "--node-rank").empty());  // JOB_COMPLETION_INDEX gives it
  CHECK(flag_value(cmd, "--nproc").empty());      // the single-node form is refused with --nnodes
  CHECK(flag_value(cmd, "--resume") == "auto");   // a replaced pod continues

  // Pod 0 as every pod reaches it: <job>-0.<service>, the Service headless, selecting the pods
  // and publishing them before they are ready, with both ports.
  const std::string job_name = job["metadata"]["name"].as<std::string>();
  const std::string svc_name = svc["metadata"]["name"].as<std::string>();
  CHECK(pod["subdomain"].as<std::string>() == svc_name);
  CHECK(flag_value(cmd, "--master-addr") == job_name + "-0." + svc_name);
  CHECK(svc["spec"]["clusterIP"].as<std::string>() == "None");
  CHECK(svc["spec"]["publishNotReadyAddresses"].as<bool>());
  for (const auto& kv : svc["spec"]["selector"])
    CHECK(spec["template"]["metadata"]["labels"][kv.first.as<std::string>()].as<std::string>() ==
          kv.second.as<std::string>());
  const int port = std::stoi(flag_value(cmd, "--master-port"));
  std::vector<int> svc_ports;
  for (const auto& p : svc["spec"]["ports"]) svc_ports.push_back(p["port"].as<int>());
  CHECK(svc_ports == std::vector<int>{port, port + 1});

  // What the launcher in pod 1 resolves from this command and its environment.
  NodeOverrides f;
  f.nnodes = nnodes;
  f.nproc_per_node = std::stoi(flag_value(cmd, "--nproc-per-node"));
  f.master_addr = flag_value(cmd, "--master-addr");
  f.master_port = port;
  const NodeEnv ne = resolve_node_env({{"JOB_COMPLETION_INDEX", "1"}}, f, 1);
  CHECK(ne.node_rank == 1);
  CHECK(ne.nnodes == 2);

  // The token from the Secret the header's first command makes (not a document of the file: an
  // apply would replace the random token with a placeholder), under the key it gives.
  bool token = false;
  const std::string header = read_file(kManifest);
  for (const auto& e : c["env"])
    if (e["name"].as<std::string>() == "DTRAIN_JOB_TOKEN") {
      const YAML::Node ref = e["valueFrom"]["secretKeyRef"];
      CHECK(header.find("kubectl create secret generic " + ref["name"].as<std::string>() +
                        " --from-literal=" + ref["key"].as<std::string>() + "=") !=
            std::string::npos);
      token = true;
    }
  CHECK(token);
  // The ranks listen on, and tell their peers, the pod's IP: its bare hostname does not resolve
  // in the other pods.
  bool pod_ip = false;
  for (const auto& e : c["env"])
    if (e["name"].as<std::string>() == "POD_IP")
      pod_ip = e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>() == "status.podIP";
  CHECK(pod_ip);
  CHECK(flag_value(cmd, "--set") == "distributed.bind=$(POD_IP)");

  // --out on the PVC (shared by the pods), the config file in the ConfigMap.
  std::map<std::string, std::string> mount_of;  // volume name -> mount path
  for (const auto& m : c["volumeMounts"])
    mount_of[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  std::string out_mount, config_mount;
  for (const auto& v : pod["volumes"]) {
    const std::string name = v["name"].as<std::string>();
    if (v["persistentVolumeClaim"] && v["persistentVolumeClaim"]["claimName"].as<std::string>() ==
                                          pvc["metadata"]["name"].as<std::string>())
      out_mount = mount_of[name];
    if (v["configMap"] &&
        v["configMap"]["name"].as<std::string>() == cm["metadata"]["name"].as<std::string>())
      config_mount = mount_of[name];
  }
  REQUIRE_FALSE(out_mount.empty());
  REQUIRE_FALSE(config_mount.empty());
  CHECK(starts_with(flag_value(cmd, "--out"), out_mount + "/"));
  CHECK(pvc["spec"]["accessModes"][0].as<std::string>() == "ReadWriteMany");
  REQUIRE(starts_with(cmd[2], config_mount + "/"));
  const std::string config_key = cmd[2].substr(config_mount.size() + 1);
  REQUIRE(cm["data"][config_key]);
  const Config cfg = parse_config(cm["data"][config_key].as<std::string>(), config_key);
  CHECK(cfg.distributed.backend == Backend::kGrpc);
  // The preemption checkpoint is bounded below the kubelet's grace period (its SIGKILL: 137).
  REQUIRE(pod["terminationGracePeriodSeconds"]);
  CHECK(cfg.train.preempt_save_timeout_s > 0);
  CHECK(cfg.train.preempt_save_timeout_s + 10 <= pod["terminationGracePeriodSeconds"].as<double>());

  // Exit 75 (checkpointed for a preemption) replaces the pod without failing the Job.
  bool requeue = false;
  for (const auto& r : spec["podFailurePolicy"]["rules"])
    if (r["action"].as<std::string>() == "Ignore" &&
        r["onExitCodes"]["containerName"].as<std::string>() == c["name"].as<std::string>())
      for (const auto& v : r["onExitCodes"]["values"]) requeue = requeue || v.as<int>() == 75;
  CHECK(requeue);
}
