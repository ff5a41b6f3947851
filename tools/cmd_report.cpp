// `megatune report`: a training run's curves (see tools/run_report.h).
#include <iostream>

#include "base/output_file.h"
#include "tools/command_registry.h"
#include "tools/run_report.h"

namespace megatune::tools {
namespace {

struct ReportArgs {
  std::string run, html;
};

const Registrar kReportCommand{Command{
    "report",
    "A training run's loss, learning-rate, throughput and memory curves from its --tensorboard-dir (text, "
    "HTML with SVG charts)",
    46, [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ReportArgs>();
      sub.add_option("--run", a->run, "the --tensorboard-dir of a megatune train run")->required();
      sub.add_option("--html", a->html, "write a self-contained HTML page with the charts here");
      sub.footer(
          "Example:\n  megatune train --model tiny --device cpu --mock-data --train-iters 50 --gbs 8 --mbs 2 "
          "--tensorboard-dir tb\n  megatune report --run tb --html run.html");
      return [a]() {
        const RunCurves run = read_run_curves(a->run);
        print_run_summary(run, std::cout);
        if (!a->html.empty()) {
          OutputFile out(a->html, "--html");
          out.stream() << run_report_html(run);
          out.commit();
          std::cout << "report: wrote " << a->html << std::endl;
        }
        return 0;
      };
    }}};

}  // namespace
}  // namespace megatune::tools
