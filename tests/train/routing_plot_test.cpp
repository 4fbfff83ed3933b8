// scripts/plot_routing.py draws the JSON that RoutingStats writes: one heatmap cell per (from, to) class pair of
// each router, one bar segment per (round, class), SKIP labelled "S", counts in the tooltips.
#include <catch2/catch.hpp>

#include <mom/models/routing_stats.hpp>

#include "helpers.hpp"

#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

mom::RoutingStats::Router make_router(std::string name, int classes, int rounds, int k, bool skip, int salt) {
  mom::RoutingStats::Router r;
  r.name = std::move(name);
  r.classes = classes;
  r.rounds = rounds;
  r.k = k;
  r.skip = skip;
  r.tokens = 1000;
  for (int i = 0; i < rounds * classes; ++i) r.usage.push_back((i * 7 + salt) % 23 + 1);
  for (int i = 0; i < classes * classes; ++i) r.transitions.push_back((i * 13 + salt) % 31);
  return r;
}

}  // namespace

TEST_CASE("scripts/plot_routing.py draws RoutingStats JSON as transition heatmaps and usage bars", "[routing][python]") {
  if (std::system("python3 -c 'import json, html' >/dev/null 2>&1") != 0) {
    WARN("SKIPPED: python3 not available");
    return;
  }
  mom_test::TempDir dir("routing_plot");
  // A chunk with N = 4 modules + SKIP, K = 2, H = 6 (MoM_P) and a chunk without SKIP, H = 1 (no transitions).
  mom::RoutingStats stats;
  stats.routers.push_back(make_router("part2.attn", 5, 6, 2, true, 1));
  stats.routers.push_back(make_router("part2.ffn", 5, 6, 2, true, 2));
  stats.routers.push_back(make_router("part4.attn", 4, 1, 3, false, 3));
  stats.routers.push_back(make_router("part4.ffn", 4, 1, 3, false, 4));
  stats.routers[0].transitions[1 * 5 + 4] = 12345;  // module 2 -> SKIP in part2.attn
  stats.write_json((dir / "routing.json").string());

  const std::string script = (mom_test::source_dir() / "scripts" / "plot_routing.py").string();
  for (const char* normalize : {"none", "rows"}) {
    INFO("--normalize " << normalize);
    const auto svg_path = dir / (std::string("routing.") + normalize + ".svg");
    const std::string cmd = "python3 '" + script + "' '" + (dir / "routing.json").string() + "' -o '" +
                            svg_path.string() + "' --normalize " + normalize + " > /dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string svg = slurp(svg_path);
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.find("</svg>") != std::string::npos);
    CHECK(count(svg, "class=\"cell\"") == 5 * 5 * 2 + 4 * 4 * 2);  // (N+1)^2 per router
    CHECK(count(svg, "class=\"bar\"") == 6 * 5 * 2 + 1 * 4 * 2);    // rounds x classes per router
    CHECK_THAT(svg, Catch::Contains("part2.attn: 2 → S: 12345"));
    CHECK_THAT(svg, Catch::Contains("part4.ffn: 4 → 4: "));          // no SKIP class: modules 1..4
    CHECK(svg.find("part4.ffn: S") == std::string::npos);
    CHECK_THAT(svg, Catch::Contains("no transitions between rounds"));  // H = 1
  }
  // --router keeps only the named chunk.
  const std::string one = "python3 '" + script + "' '" + (dir / "routing.json").string() + "' --router part4 -o '" +
                          (dir / "part4.svg").string() + "' > /dev/null";
  REQUIRE(std::system(one.c_str()) == 0);
  CHECK(count(slurp(dir / "part4.svg"), "class=\"cell\"") == 4 * 4 * 2);
  // A malformed file is refused with a non-zero exit.
  std::ofstream(dir / "bad.json") << R"({"routers": [{"name": "x", "classes": 3, "skip_is_last": true, "rounds": 1,
    "k": 1, "tokens": 1, "usage": [[1, 2, 3]], "transitions": [[1, 2], [3, 4]]}]})";
  const std::string bad = "python3 '" + script + "' '" + (dir / "bad.json").string() + "' -o '" +
                          (dir / "bad.svg").string() + "' > /dev/null 2>&1";
  CHECK(std::system(bad.c_str()) != 0);
}
