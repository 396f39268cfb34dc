set terminal pngcairo size 1280,520 noenhanced font "Sans,11"
set output "mlp-throughput.png"
set grid
set multiplot layout 1,2 title "Fashion-MNIST MLP: training throughput vs worker count - small-straggler-10ms, straggler 10ms on the last worker" font "Sans,13"
$d0 << EOD
1 41607.5 41607.5
2 9898.91 4949.45
4 16169.5 4042.38
EOD
$d1 << EOD
2 25225 12612.5
4 29141.3 7285.32
EOD
$d2 << EOD
1 48267.5 48267.5
2 34604.9 17302.4
4 37398 9349.51
EOD
$d3 << EOD
1 46211.4 46211.4
2 10106.4 5053.22
4 15678.6 3919.64
EOD
$d4 << EOD
1 41284.1 41284.1
2 10006.7 5003.36
4 15967.8 3991.94
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
