set terminal pngcairo size 1280,520 noenhanced font "Sans,11"
set output "mlp-throughput.png"
set grid
set multiplot layout 1,2 title "Fashion-MNIST MLP: training throughput vs worker count - full" font "Sans,13"
$d0 << EOD
1 39739.6 39739.6
2 37212.8 18606.4
4 29316.3 7329.08
EOD
$d1 << EOD
2 38668 19334
4 31279.1 7819.77
EOD
$d2 << EOD
1 49180.8 49180.8
2 40544.3 20272.1
4 35785.5 8946.38
EOD
$d3 << EOD
1 43058.7 43058.7
2 30896.7 15448.3
4 27692 6923
EOD
$d4 << EOD
1 45566.6 45566.6
2 29443 14721.5
4 35220.3 8805.07
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
