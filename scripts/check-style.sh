#!/usr/bin/env bash
# keel's layout rules that make check enforces in src/ (the library): no line over 150 columns, and
# one statement per line (a `for` header's two semicolons aside). .clang-format (column 120) is the
# layout itself: `make format` applies it. Prints each offending line; exits 1 when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files "src/*.c" "src/*.h" "src/*.cu")
perl -e '
  my $bad = 0;
  for my $f (@ARGV) {
    open(my $fh, "<", $f) or die "$f: $!";
    my $in_comment = 0;
    while (my $line = <$fh>) {
      chomp $line;
      my $n = length($line);
      if ($n > 150) { print "$f:$.: $n columns (at most 150)\n"; $bad++; }
      my $s = $line;
      # comments, strings and character literals do not count
      if ($in_comment) { if ($s =~ s{^.*?\*/}{}) { $in_comment = 0 } else { next } }
      $s =~ s{/\*.*?\*/}{}g;
      if ($s =~ s{/\*.*$}{}) { $in_comment = 1 }
      $s =~ s{//.*$}{};
      $s =~ s{"(?:[^"\\]|\\.)*"}{""}g;
      $s =~ s{'"'"'(?:[^'"'"'\\]|\\.)*'"'"'}{0}g;
      # a for header: drop what is between its parentheses
      1 while $s =~ s{\bfor\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)}{for}g;
      my $k = () = $s =~ /;/g;
      if ($k > 1) { print "$f:$.: $k statements on one line\n"; $bad++; }
    }
  }
  print "check-style: $bad line(s) to fix\n" if $bad;
  exit($bad ? 1 : 0);
' $files || exit 1
