set terminal pngcairo size 1280,520 noenhanced font "Sans,11"
set output "ctr-throughput.png"
set grid
set multiplot layout 1,2 title "synthetic CTR: training throughput vs worker count - full" font "Sans,13"
$d0 << EOD
1 234248 234248
2 178846 89422.9
4 134327 33581.7
EOD
$d1 << EOD
2 236144 118072
4 149268 37317
EOD
$d2 << EOD
1 240801 240801
2 336016 168008
4 422320 105580
EOD
$d3 << EOD
1 232272 232272
2 221277 110638
4 203506 50876.5
EOD
$d4 << EOD
1 252152 252152
2 190618 95309.1
4 138195 34548.8
EOD
set autoscale
unset label 1
set key below horizontal box maxcols 3 Left reverse width 2
set bmargin 7
set title "all workers"
set xlabel "workers"
set ylabel "examples/s, all workers (evaluation excluded)"
set xtics (1, 2, 4)
set xrange [0.5:4.5]
set yrange [0:*]
plot $d0 using 1:2 with linespoints lc rgb "#1f77b4" pt 7 ps 1.0 lw 2 title "sync", \
     $d1 using 1:2 with linespoints lc rgb "#d62728" pt 5 ps 1.0 lw 2 title "sync+backup1", \
     $d2 using 1:2 with linespoints lc rgb "#2ca02c" pt 9 ps 1.0 lw 2 title "async", \
     $d3 using 1:2 with linespoints lc rgb "#ff7f0e" pt 11 ps 1.0 lw 2 title "ssp:2", \
     $d4 using 1:2 with linespoints lc rgb "#9467bd" pt 13 ps 1.0 lw 2 title "ssp:8"
set autoscale
unset label 1
set key below horizontal box maxcols 3 Left reverse width 2
set bmargin 7
set title "per worker (mean)"
set xlabel "workers"
set ylabel "examples/s per worker (evaluation excluded)"
set xtics (1, 2, 4)
set xrange [0.5:4.5]
set yrange [0:*]
plot $d0 using 1:3 with linespoints lc rgb "#1f77b4" pt 7 ps 1.0 lw 2 title "sync", \
     $d1 using 1:3 with linespoints lc rgb "#d62728" pt 5 ps 1.0 lw 2 title "sync+backup1", \
     $d2 using 1:3 with linespoints lc rgb "#2ca02c" pt 9 ps 1.0 lw 2 title "async", \
     $d3 using 1:3 with linespoints lc rgb "#ff7f0e" pt 11 ps 1.0 lw 2 title "ssp:2", \
     $d4 using 1:3 with linespoints lc rgb "#9467bd" pt 13 ps 1.0 lw 2 title "ssp:8"
unset multiplot
