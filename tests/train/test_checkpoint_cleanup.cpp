// Run-directory hygiene: what an interrupted run leaves (temporary files, half-written step folders) is
// removed at the next start or save, a step folder that is not `latest`'s is replaced instead of duplicated,
// re-saving the step `latest` names keeps one folder per step, and pruning keeps the newest and one earlier.
#include <catch2/catch.hpp>

#include <mom/mom.hpp>
#include <mom/train/train.hpp>

#include "helpers.hpp"

#include <sys/wait.h>

#include <fstream>
#include <set>

using namespace mom;
using namespace mom::train;
using mom_test::read_bytes;
using mom_test::write_bytes;
using mom_test::dead_pid;

namespace {

constexpr Dims tiny{.d_model = 32, .heads = 2, .d_ff = 64, .vocab = 256, .context = 32};
using Tiny = LM<tiny, Dense<2>>;
using Instance = decltype(Tiny::make<cpu::Backend<float>>(1));
using Ckpt = Checkpointer<Instance>;

// The names in a folder.
std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

struct Run {
  mom_test::TempDir dir{"cleanup"};
  Instance model = Tiny::make<cpu::Backend<float>>(1);
  std::vector<float> m = std::vector<float>(Tiny::params, 0.f), v = std::vector<float>(Tiny::params, 0.f);
  std::filesystem::path run = dir / "run";
  std::filesystem::path save(std::int64_t step) {
    m[0] = float(step);  // each save distinguishable
    return Ckpt::save(run, model, m, v, {step, rng_state(std::mt19937_64(1))});
  }
  std::int64_t loaded_step() {
    auto other = Tiny::make<cpu::Backend<float>>(2);
    std::vector<float> m2(Tiny::params), v2(Tiny::params);
    TrainState s;
    Ckpt::load(run, other, m2, v2, s);
    CHECK(m2[0] == float(s.step));
    return s.step;
  }
  std::string latest() { return read_bytes(run / "latest"); }
};

}  // namespace

TEST_CASE("step folder names", "[checkpoint][cleanup]") {
  CHECK(step_folder_step("step-000500") == 500);
  CHECK(step_folder_step("step-000500.1") == 500);
  CHECK(step_folder_step("step-1234567") == 1234567);
  for (const char* other : {"step-", "step-12a", "step-12.", "step-12.x", "step-1.2.3", "latest", "data", "step12",
                            "step--1", "step-+1"})
    CHECK_FALSE(step_folder_step(other).has_value());
  CHECK(parse_int64("42") == 42);
  CHECK(parse_int64("-42") == -42);
  for (const char* bad : {"", " 1", "1 ", "+1", "1.0", "1e3", "0x10", "3abc", "99999999999999999999"})
    CHECK_FALSE(parse_int64(bad).has_value());
}

TEST_CASE("saving a step again keeps one folder per step", "[checkpoint][cleanup]") {
  Run r;
  r.save(1);
  r.save(2);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000001", "step-000002"});
  r.save(2);  // the same step again (e.g. an explicit save right after a resume)
  CHECK(r.latest() == "step-000002.1\n");
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000001", "step-000002.1"});
  r.save(2);
  CHECK(r.latest() == "step-000002\n");
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000001", "step-000002"});
  CHECK(r.loaded_step() == 2);
  r.save(3);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000002", "step-000003"});
  // Duplicates an older version left (step-N.1, step-N.2) and folders of other steps go at the next save.
  for (const char* old : {"step-000003.1", "step-000003.2", "step-000001"})
    std::filesystem::copy(r.run / "step-000002", r.run / old);
  r.save(4);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000003", "step-000004"});
  CHECK(r.loaded_step() == 4);
}

TEST_CASE("a step folder that latest does not name is replaced, not duplicated", "[checkpoint][cleanup]") {
  Run r;
  r.save(1);
  r.save(2);
  SECTION("complete (written by a run killed before it moved latest)") {
    std::filesystem::copy(r.run / "step-000002", r.run / "step-000003");
    write_bytes(r.run / "step-000003" / "marker", "old");
  }
  SECTION("half written (killed mid-save): optimizer only, a temporary model file") {
    std::filesystem::create_directories(r.run / "step-000003");
    std::filesystem::copy(r.run / "step-000002" / "optimizer.safetensors", r.run / "step-000003");
    write_bytes(r.run / "step-000003" / (".model.safetensors.tmp." + std::to_string(dead_pid())), "partial");
  }
  r.save(3);
  CHECK(r.latest() == "step-000003\n");
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000002", "step-000003"});
  CHECK(entries(r.run / "step-000003") == std::set<std::string>{"model.safetensors", "optimizer.safetensors"});
  CHECK(r.loaded_step() == 3);
}

TEST_CASE("resuming from an earlier step and saving drops the abandoned later folders", "[checkpoint][cleanup]") {
  Run r;
  r.save(3);
  r.save(4);
  r.save(5);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000004", "step-000005"});
  r.save(4);  // trained again from step-000004's state (resumed from that folder): it replaces it
  CHECK(r.latest() == "step-000004\n");
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000004"});
  CHECK(r.loaded_step() == 4);
}

TEST_CASE("clean_run_dir removes what a killed run left, and nothing else", "[checkpoint][cleanup]") {
  Run r;
  r.save(1);
  r.save(2);
  const std::string d = std::to_string(dead_pid()), parent = std::to_string(::getppid());
  // Left by killed processes: temporary files, half-written step folders.
  for (const std::string& name : {".latest.tmp." + d, ".mom_write_test." + d, ".metrics.jsonl.tmp." + d})
    write_bytes(r.run / name, "x");
  std::filesystem::create_directories(r.run / "step-000003");  // empty: killed right after creating it
  std::filesystem::create_directories(r.run / "step-000004.1");
  write_bytes(r.run / "step-000004.1" / "optimizer.safetensors", "x");
  write_bytes(r.run / "step-000004.1" / (".model.safetensors.tmp." + d), "x");
  // Not to be touched: user files, a folder another live process is writing, a complete orphan, latest's.
  write_bytes(r.run / "notes.txt", "mine");
  std::filesystem::create_directories(r.run / "step-000009");
  write_bytes(r.run / "step-000009" / (".optimizer.safetensors.tmp." + parent), "x");
  std::filesystem::copy(r.run / "step-000002", r.run / "step-000007");
  std::filesystem::create_directories(r.run / "stepping");
  const auto before = entries(r.run);
  CHECK(clean_run_dir(r.run) == 5);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "notes.txt", "step-000001", "step-000002", "step-000007",
                                                "step-000009", "stepping"});
  CHECK(r.loaded_step() == 2);
  CHECK(clean_run_dir(r.run) == 0);
  CHECK(clean_run_dir(r.dir / "missing") == 0);
  // latest's folder stays even when it looks incomplete (loading it is what reports the problem).
  std::filesystem::remove(r.run / "step-000002" / "optimizer.safetensors");
  CHECK(clean_run_dir(r.run) == 0);
  CHECK(std::filesystem::exists(r.run / "step-000002"));
  CHECK_THROWS_WITH(r.loaded_step(), Catch::Contains("optimizer.safetensors' does not exist"));
  (void)before;
}

TEST_CASE("the trainer's start removes stale temporary files (ensure_writable_dir)", "[checkpoint][cleanup]") {
  Run r;
  r.save(1);
  const std::string d = std::to_string(dead_pid());
  write_bytes(r.run / (".latest.tmp." + d), "x");
  write_bytes(r.run / (".mom_write_test." + d), "x");
  ensure_writable_dir(r.run);
  CHECK(entries(r.run) == std::set<std::string>{"latest", "step-000001"});
}
