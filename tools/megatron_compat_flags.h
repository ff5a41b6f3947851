// The Megatron-LM flags a pasted training script passes that megatune's `train` does not run as options of
// its own: flags that only pick Megatron's implementation, logging or profiling (accepted and named once),
// flags accepted at the one value megatune runs (--attention-dropout 0.0, --rotary-percent 1.0, ...), and
// flags that would change the result in a way megatune does not run (refused with one line: the reason and
// what to do).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace megatune::tools {

struct CompatFlag;

// What the command line gave of the compatibility flags, in the order CLI11 reported them.
struct MegatronCompatFlags {
  struct Given {
    const CompatFlag* flag = nullptr;
    std::vector<std::string> values;  // empty for a flag without a value
    const CLI::Option* option = nullptr;
  };
  std::vector<Given> given;
};

// Registers every compatibility flag on `app` (help group "Megatron compatibility").
void add_megatron_compat_flags(CLI::App& app, MegatronCompatFlags& flags);

// Puts `flags.given` in command-line order (CLI11 reports them in registration order).
void order_as_given(MegatronCompatFlags& flags, const CLI::App& app);
// Throws UserError for the first refused flag (or accepted flag at a value megatune does not run), naming
// the others refused as well.
void check_megatron_compat_flags(const MegatronCompatFlags& flags);

// One line naming the accepted flags that change nothing here, and what each with a note means for the
// run; "" when none was given.
std::string accepted_compat_flags_line(const MegatronCompatFlags& flags);

// Whether the command line gave the compatibility flag `name` ("--fp16").
bool given(const MegatronCompatFlags& flags, const std::string& name);

// The names of every registered compatibility flag (for tests).
std::vector<std::string> megatron_compat_flag_names();

}  // namespace megatune::tools
