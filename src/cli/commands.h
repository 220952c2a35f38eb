// Each subcommand family registers itself on the CLI11 app. Callbacks throw memfit::Error on
// expected failures; main() prints it as one line and exits 1.
#pragma once

namespace CLI { class App; }

namespace memfit::cli {

void add_data_commands(CLI::App & app);    // prepare, tokenize      (cmd_data.cpp)
void add_train_commands(CLI::App & app);   // train, profile, monitor, bench, verify (cmd_train.cpp)
void add_model_commands(CLI::App & app);   // export                 (cmd_model.cpp)
void add_generate_command(CLI::App & app); // generate               (cmd_generate.cpp)
void add_plan_commands(CLI::App & app);    // plan                   (cmd_plan.cpp)
void add_quant_commands(CLI::App & app);   // quantize, eval         (cmd_quant.cpp)

}  // namespace memfit::cli
