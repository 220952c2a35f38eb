#!/usr/bin/env bash
# Docs that cannot go stale: runs what README.md and docs/*.md mark, and fails on any difference.
#
#   scripts/check-docs.sh [--all] [--update] [--memfit PATH] [FILE.md ...]
#
# Marks (HTML comments on the line before a fenced block, invisible when rendered):
#   <!-- check: run -->        run the block (bash, -e) in a scratch folder; fails on a non-zero exit
#   <!-- check: run slow -->   the same, only with --all (minutes of training: bench/, not CI)
#   <!-- check: output -->     the block is `$ memfit ...` (continued by trailing backslashes) and its
#                              output: rerun the command and compare line for line; a line `...`
#                              stands for any lines. --update rewrites such blocks (those without
#                              `...`) from the program's output instead.
#   <!-- check: defaults of memfit SUB -->  a table whose rows start | `--flag`, `--flag2` | default,
#                              default2 |: each default must be the one SUB's --help shows (where it
#                              shows one)
# and one mark for figures quoted in prose:
#   <!-- check: quotes "FIGURE" ... in: memfit ARGS -->   each FIGURE must appear in the output and
#                              in the paragraph or table under the mark.
# Every `memfit SUBCOMMAND --flag` in any code block of the files must name a flag that
# SUBCOMMAND's --help lists (a renamed flag fails even in a block that is not run).
#
# The scratch folder holds links to the tree's data/, tests/ and bench/, and `memfit` on PATH is
# build/memfit (--memfit PATH: another binary). Exit 0 when everything matches; else 1, each
# failure named by file and line with a diff.
# shellcheck disable=SC2094  # the doc is read line by line; the rewrite goes to another file
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ALL=0
UPDATE=0
MEMFIT="$ROOT/build/memfit"
FILES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --all) ALL=1 ;;
    --update) UPDATE=1 ;;
    --memfit) MEMFIT="$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-docs: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) FILES+=("$1") ;;
  esac
  shift
done
if [ ${#FILES[@]} -eq 0 ]; then FILES=("$ROOT/README.md" "$ROOT"/docs/*.md); fi
if [ ! -x "$MEMFIT" ]; then echo "check-docs: no memfit binary at $MEMFIT (build first: bash scripts/build.sh)" >&2; exit 2; fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/memfit-docs.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/bin" "$WORK/help"
ln -s "$(cd "$(dirname "$MEMFIT")" && pwd)/$(basename "$MEMFIT")" "$WORK/bin/memfit"
export PATH="$WORK/bin:$PATH"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# The docs' mpirun lines as a user types them; CI runs as root, which OpenMPI refuses unless told.
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
FAILED=0
CHECKED=0

fail() {   # file line message [diff file]
  FAILED=$((FAILED + 1))
  echo "check-docs: FAIL ${1#"$ROOT"/}:$2: $3" >&2
  if [ -n "${4:-}" ]; then sed 's/^/    /' "$4" | head -40 >&2; fi
}

# A fresh scratch folder for a block: the tree's data, tests and bench reachable by their paths.
scratch() {
  local d="$WORK/run.$1"
  rm -rf "$d" && mkdir -p "$d"
  for x in data tests bench; do ln -s "$ROOT/$x" "$d/$x"; done
  echo "$d"
}

# What varies from run to run, or with the cores, in output the docs quote: the search's wall
# time, how many exact programs it recorded ahead (up to one per core), and so how many of the
# candidates near the limit were judged by an exact plan rather than the analytic model (fit).
normalize() {
  sed -E 's/configurations evaluated, [0-9]+ fit, (.*), [0-9]+ engine programs recorded, [0-9.]+ s$/configurations evaluated, N fit, \1, N engine programs recorded, T s/'
}

# Expected (with `...` lines) against actual; 0 when they match.
matches() {
  awk -v exp_file="$1" '
    BEGIN { while ((getline l < exp_file) > 0) e[ne++] = l }
    { a[na++] = $0 }
    END {
      i = 0; j = 0
      while (i < ne) {
        if (e[i] == "...") {            # find the next literal line at or after j
          i++
          if (i == ne) exit 0
          while (j < na && a[j] != e[i]) j++
          if (j == na) exit 1
          continue
        }
        if (j >= na || a[j] != e[i]) exit 1
        i++; j++
      }
      exit (j == na) ? 0 : 1
    }' "$2"
}

# `memfit SUB ARGS` of a code block's line: every --flag must be in SUB's --help.
check_flags() {   # file line text
  local sub flag
  # memfit in command position: after a prompt, variable assignments, mpirun/srun or build/.
  sub="$(sed -nE 's#^[[:space:]]*(\$ )?([A-Za-z_]+=[^ ]* )*((mpirun|srun) .*)?(build/)?memfit ([a-z]+)( .*)?$#\6#p' <<<"$3")"
  [ -n "$sub" ] || return 0
  if [ ! -f "$WORK/help/$sub" ]; then
    memfit "$sub" --help </dev/null >"$WORK/help/$sub" 2>&1 || { fail "$1" "$2" "memfit $sub: not a command"; : >"$WORK/help/$sub"; return; }
  fi
  [ -s "$WORK/help/$sub" ] || return 0
  for flag in $(grep -oE '(^| )--[a-z][a-z0-9-]*' <<<"${3#*memfit "$sub"}" | tr -d ' ' | sort -u); do
    grep -qE "(^| |,)$flag([ ,=]|$)" "$WORK/help/$sub" || fail "$1" "$2" "memfit $sub has no flag $flag (memfit $sub --help)"
  done
}

# A table's rows `| \`--a\`, \`--b\` | x (note), y | ...`: each default against --help's `--a TYPE=x`.
check_defaults() {   # file line sub table-file
  local flags defaults i flag want have
  memfit "$3" --help >"$WORK/help.$3" 2>&1
  while IFS= read -r row; do
    flags="$(cut -d'|' -f2 <<<"$row")"
    defaults="$(cut -d'|' -f3 <<<"$row" | sed -E 's/\([^)]*\)//g; s/`//g')"
    [[ "$flags" == *--* ]] || continue
    i=0
    while IFS= read -r flag; do
      i=$((i + 1))
      want="$(cut -d, -f"$i" <<<"$defaults" | xargs)"
      have="$(sed -nE "s/^ *$flag [A-Z]+[^ =]*=([^ ]+) .*/\1/p" "$WORK/help.$3" | head -1)"
      if [ -z "$have" ] || [ -z "$want" ]; then continue; fi
      [ "$want" = "$have" ] || fail "$1" "$2" "$flag: the table says default $want, memfit $3 --help says $have"
    done < <(grep -oE -- '--[a-z][a-z0-9-]*' <<<"$flags")
  done <"$4"
}

run_block() {   # file line slow body-file
  local dir
  if [ "$3" = slow ] && [ $ALL -eq 0 ]; then return; fi
  dir="$(scratch "$2")"
  CHECKED=$((CHECKED + 1))
  if ! (cd "$dir" && bash -e "$4") </dev/null >"$WORK/out" 2>&1; then
    fail "$1" "$2" "the block did not run (exit non-zero); its output's tail:" <(tail -20 "$WORK/out")
  fi
}

# The block's first lines are `$ memfit ...` (backslash-continued); the rest is what it prints.
output_block() {   # file line body-file; prints the new block on stdout under --update
  local cmd="" line n=0 dir
  while IFS= read -r line; do
    n=$((n + 1))
    line="${line#\$ }"
    cmd+="${line#"${line%%[! ]*}"}"
    [[ "$line" == *\\ ]] || break
    cmd="${cmd%\\} "
  done <"$3"
  tail -n +$((n + 1)) "$3" >"$WORK/expected"
  dir="$(scratch "$2")"
  CHECKED=$((CHECKED + 1))
  (cd "$dir" && bash -c "$cmd") </dev/null >"$WORK/raw" 2>&1
  if [ $UPDATE -eq 1 ] && ! grep -qx '\.\.\.' "$WORK/expected"; then
    head -n "$n" "$3"
    cat "$WORK/raw"
    return
  fi
  normalize <"$WORK/raw" >"$WORK/actual"
  normalize <"$WORK/expected" >"$WORK/expected.n"
  if ! matches "$WORK/expected.n" "$WORK/actual"; then
    diff -u --label documented --label "the program now" "$WORK/expected.n" "$WORK/actual" >"$WORK/diff"
    fail "$1" "$2" "\`$cmd\` prints something else now (scripts/check-docs.sh --update rewrites it)" "$WORK/diff"
  fi
  [ $UPDATE -eq 1 ] && cat "$3"
}

quotes() {   # file line mark
  local spec="${3#*check: quotes }" cmd figures dir fig
  cmd="${spec#* in: }"
  cmd="${cmd% -->*}"
  figures="${spec%% in: *}"
  dir="$(scratch "$2")"
  CHECKED=$((CHECKED + 1))
  (cd "$dir" && bash -c "$cmd") </dev/null >"$WORK/actual" 2>&1
  # The paragraph (or table) under the mark: up to its first blank line.
  tail -n +$(($2 + 1)) "$1" | awk '/^<!-- check: / { next } NF == 0 && seen { exit } NF { seen = 1; print }' >"$WORK/para"
  while IFS= read -r fig; do
    [ -n "$fig" ] || continue
    grep -qF -- "$fig" "$WORK/actual" || fail "$1" "$2" "\"$fig\" is not in the output of \`$cmd\`"
    grep -qF -- "$fig" "$WORK/para" || fail "$1" "$2" "\"$fig\" is checked but not quoted in the paragraph under the mark"
  done < <(grep -oE '"[^"]*"' <<<"$figures" | sed 's/^"//; s/"$//')
}

check_file() {
  local f="$1" mark="" inblock=0 start=0 lineno=0 line body out cmdline="" sub
  body="$WORK/body"
  out="$WORK/updated"
  : >"$out"
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    if [ $inblock -eq 0 ]; then
      echo "$line" >>"$out"
      if [[ "$mark" == '<!-- check: defaults of memfit '* ]]; then
        if [[ "$line" == '|'* ]]; then echo "$line" >>"$WORK/table"; continue; fi
        if [ -s "$WORK/table" ]; then
          sub="${mark#*of memfit }"
          check_defaults "$f" "$lineno" "${sub%% *}" "$WORK/table"
          CHECKED=$((CHECKED + 1))
          mark=""
        fi
      fi
      case "$line" in
        '<!-- check: quotes '*) quotes "$f" "$lineno" "$line" ;;
        '<!-- check: defaults of memfit '*) mark="$line"; : >"$WORK/table"; continue ;;
        '<!-- check: '*) mark="$line" ;;
        '```'*) inblock=1; start=$lineno; : >"$body" ;;
        *) [ -n "${line// /}" ] && mark="" ;;
      esac
      continue
    fi
    if [[ "$line" == '```'* ]]; then
      inblock=0
      case "$mark" in
        '<!-- check: run -->') run_block "$f" "$start" fast "$body"; cat "$body" >>"$out" ;;
        '<!-- check: run slow -->') run_block "$f" "$start" slow "$body"; cat "$body" >>"$out" ;;
        '<!-- check: output -->') output_block "$f" "$start" "$body" >>"$out" ;;
        '') cat "$body" >>"$out" ;;
        *) fail "$f" "$start" "unknown mark: $mark"; cat "$body" >>"$out" ;;
      esac
      [ "$mark" = '<!-- check: output -->' ] && [ $UPDATE -eq 0 ] && cat "$body" >>"$out"
      echo "$line" >>"$out"
      mark=""
      continue
    fi
    echo "$line" >>"$body"
    # A command's lines joined where they end in a backslash; an output block's output is the program's.
    cmdline+="${line%\\} "
    if [[ "$line" != *\\ ]]; then
      if [[ "$mark" != '<!-- check: output -->' || "$cmdline" == '$ '* ]]; then check_flags "$f" "$lineno" "$cmdline"; fi
      cmdline=""
    fi
  done <"$f"
  if [ $UPDATE -eq 1 ] && ! cmp -s "$out" "$f"; then cp "$out" "$f" && echo "check-docs: updated ${f#"$ROOT"/}"; fi
}

for f in "${FILES[@]}"; do check_file "$f"; done
if [ $FAILED -gt 0 ]; then
  echo "check-docs: $FAILED failure(s) in ${#FILES[@]} file(s) ($CHECKED blocks run)" >&2
  exit 1
fi
echo "check-docs: ${#FILES[@]} file(s), $CHECKED blocks run$([ $ALL -eq 0 ] && echo ' (slow ones skipped: --all)'), every flag known: ok"
