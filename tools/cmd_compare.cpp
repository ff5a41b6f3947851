// `megatune compare`: predicted vs measured for a traced run (see tools/compare_command.h).
#include <iostream>

#include "tools/command_registry.h"
#include "tools/compare_command.h"
#include "tools/input_checks.h"

namespace megatune::tools {
namespace {

const Registrar kCompareCommand{Command{
    "compare",
    "Set a traced run (train --trace-dir) beside its prediction: step time, MFU, memory, per op kind and op",
    45, [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<CompareOptions>();
      sub.add_option(
             "--run", o->runs,
             "the --trace-dir of a megatune train run; several: each compared, then the error per layout")
          ->required();
      sub.add_option(
          "--simulate-args", o->simulate_args,
          "Megatron flags of the (model, layout) to simulate, in one string (default: the run's own)");
      sub.add_option("--plan", o->plan, "simulate the winner of this plan.json (megatune plan -o)");
      sub.add_option("--cluster", o->cluster, "NODESxGPUSxTYPE to simulate (default: the run's device)");
      sub.add_option("--db", o->db,
                     "cost database (default: the default database if it exists, else embedded)");
      sub.add_option("--html", o->html, "write a self-contained HTML report with SVG plots here");
      sub.add_option("--perfetto", o->perfetto,
                     "write a Chrome-trace JSON with predicted and measured tracks here");
      sub.add_option("--top", o->top, "worst ops listed per rank (default 15)")->check(CLI::Range(0, 100000));
      sub.add_option("--rank", o->rank, "only this rank's per-kind and per-op tables")
          ->check(integer_at_least(0));
      sub.add_flag(
          "--save", o->save,
          "store each traced rank as a run (runs + run_ops: per-op predicted and measured times) in the "
          "--db database (default: the default database)");
      sub.add_flag("--no-calibration", o->no_calibration,
                   "price without the corrections fitted from traced runs (megatune db calibrate)");
      sub.add_flag("--leave-one-out", o->leave_one_out,
                   "with several --run: predict each from a calibration fitted on the others; print the step "
                   "time error before and after calibration");
      sub.add_option(
          "--hold-out", o->hold_out,
          "with --leave-one-out, what is held out together: run (default), shape (runs of one model, "
          "seq length and micro-batch) or model");
      sub.footer(
          "Example:\n  megatune train --model tiny --device cpu --mock-data --train-iters 5 --gbs 4 --mbs 2 "
          "--trace-dir run1\n  megatune compare --run run1 --html run1.html --perfetto run1.trace.json\n"
          "  megatune compare --leave-one-out --run run-mbs1 --run run-mbs2 --run run-mbs4");
      return [o]() {
        run_compare(*o, std::cout);
        return 0;
      };
    }}};

}  // namespace
}  // namespace megatune::tools
