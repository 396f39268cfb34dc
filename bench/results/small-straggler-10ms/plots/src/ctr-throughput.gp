set terminal pngcairo size 1280,520 noenhanced font "Sans,11"
set output "ctr-throughput.png"
set grid
set multiplot layout 1,2 title "synthetic CTR: training throughput vs worker count - small-straggler-10ms, straggler 10ms on the last worker" font "Sans,13"
$d0 << EOD
1 160846 160846
2 39195.4 19597.7
4 57449.7 14362.4
EOD
$d1 << EOD
2 135030 67515.2
4 140473 35118.3
EOD
$d2 << EOD
1 170033 170033
2 185606 92802.8
4 131482 32870.6
EOD
$d3 << EOD
1 180095 180095
2 43561.8 21780.9
4 50059.5 12514.9
EOD
$d4 << EOD
1 176757 176757
2 41462.2 20731.1
4 45478.1 11369.5
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
