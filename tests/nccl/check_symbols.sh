#!/usr/bin/env bash
# Checks loom's libnccl.so.2 against the nccl.h it was built for:
#   check_symbols.sh LIBNCCL NCCL_H
# - every function nccl.h declares (ncclX and its profiling name pncclX) is exported, as a function;
# - nothing else is: no loom symbol, no C++ runtime symbol leaks out of the library;
# - the SONAME is libnccl.so.2 and the file name carries the header's version.
set -euo pipefail
lib=$1
header=$2
fail=0
# The header's functions: names followed by "(" once comments are gone (macros are upper case).
declared=$(perl -0pe 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g' "$header" | grep -oE '\bp?nccl[A-Za-z0-9_]*[[:space:]]*\(' |
  tr -d ' (' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" { print $3 }' | sort -u)
everything=$(nm -D --defined-only "$lib" | awk '{ print $3 }' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$everything"))
if [ -n "$missing" ]; then
  echo "check_symbols: declared in $header but not exported by $lib:"
  echo "$missing" | sed 's/^/  /'
  fail=1
fi
if [ -n "$extra" ]; then
  echo "check_symbols: exported by $lib but not declared in $header:"
  echo "$extra" | sed 's/^/  /'
  fail=1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" != "libnccl.so.2" ]; then
  echo "check_symbols: SONAME is '$soname', expected libnccl.so.2"
  fail=1
fi
version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) / { v = v (v ? "." : "") $3 } END { print v }' "$header")
real=$(readlink -f "$lib")
case "$real" in
  *"libnccl.so.$version") ;;
  *) echo "check_symbols: $real does not carry the header's version $version"; fail=1 ;;
esac
count=$(echo "$declared" | wc -l)
[ $fail -eq 0 ] && echo "check_symbols: $count functions of NCCL $version exported, nothing else; SONAME $soname"
exit $fail
